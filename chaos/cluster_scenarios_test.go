package chaos

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
)

// clusterHazard is what single cannot promise on a Redis Cluster.
const clusterHazard = "asynchronous replication: a Cluster failover can promote a replica that never received the lock"

// 17. single on a Redis Cluster of 3 masters with a replica each, failover
// before replication. The fence counter of key K is made to exist on K's
// master and its replica (a first lock, released, replicated). Then the
// replica is put behind (redistest.Cluster.StopReplication: credentials
// its master refuses, then its link closed, so no later write can reach
// it), A takes K on the master alone (the replica is checked to lack it),
// and the replica takes over its master's slots (CLUSTER FAILOVER
// TAKEOVER). B, on its own Cluster client, is granted K from the new
// master while A still holds it: the documented hazard (O2, HAZARD). A
// learns at its next renewal, which the old master, now a replica of the
// new one, answers with MOVED. The counter on the new master is the one
// from before A's grant, so B's fence equals A's and the register refuses
// B's write: O1 holds.
//
// The attack must have run for the verdict to mean anything: the scenario
// fails (FAIL) when the replica was not behind, when B was not granted,
// or when B's grant found A no longer valid (no double grant at all).
func TestScenario17SingleClusterFailoverBeforeReplication(t *testing.T) {
	run(t, scenario{name: "17 single: Cluster failover before replication", strategy: "single + Cluster (3 masters, 3 replicas)",
		faults: "replica's link cut, CLUSTER FAILOVER TAKEOVER", fast: true,
		exp: Expectation{AllowOverlap: true, Why: clusterHazard}},
		func(t *testing.T, rec *Recorder) facts {
			ctx := t.Context()
			cl := redistest.StartClusterWithReplicas(t, 3, 1)
			ca, cb := cl.Client(), cl.Client() // two processes, two clients
			reg := storage(t, rec, "s17")
			w := watchdog(t)
			const ttl = 6 * time.Second // renewed every 2 s: A learns within one renewal
			la := sentinelLocker(t, ca, ttl, redlease.WithKeeper(w))
			lb := sentinelLocker(t, cb, ttl, redlease.WithRetryDelay(2*time.Millisecond, 20*time.Millisecond))
			const key, lockKey = "s17", "chaos:s17"
			m := cl.MasterOf(ctx, ca, lockKey)
			r := cl.ReplicaOf(m)
			cl.WaitRoute(cb, lockKey, m)

			// The fence counter on both: a first lock, released, replicated.
			first, err := la.TryLock(ctx, key)
			if err != nil {
				t.Fatalf("first lock: %v", err)
			}
			if err := first.Release(ctx); err != nil {
				t.Fatalf("first release: %v", err)
			}
			probe := redistest.StartStallProbe(t)
			probe.WaitFor(t, time.Second, 3, 5*time.Millisecond, func() bool { return cl.Lag(m, r) == 0 },
				"replica %s to catch up with %s before the cut", r.Addr, m.Addr)

			endCut := fault(rec, "replica's link cut")
			cl.StopReplication(m, r)

			granted, aDone := holdUntilLost(ctx, t, rec, reg, la, "a", key, 3*ttl)
			a := <-granted
			aGrant := rec.Now()
			aLost := make(chan time.Duration, 1)
			go func() { <-a.Lost(); aLost <- rec.Now() }()

			var violations []string
			lag := cl.Lag(m, r)
			onReplica, rerr := r.ReadOnlyGet(ctx, lockKey)
			if lag <= 0 || !errors.Is(rerr, redis.Nil) {
				violations = append(violations, fmt.Sprintf("the replica was not behind when promoted (lag %d bytes, its copy of the lock key: %q, %v): the attack did not run", lag, onReplica, rerr))
			}

			endTake := fault(rec, "CLUSTER FAILOVER TAKEOVER")
			promoted := rec.At(cl.Takeover(r, cb, lockKey))
			routed := rec.Now() // B's client routes K to the new master
			endTake()

			b := lockWithin(ctx, t, probe, lb, key)
			bFrom := rec.Now()
			aValid, aUntil := a.Valid(), rec.At(a.Until())
			_, _ = reg.Write(ctx, "b", b.Fence(), 1)

			// B holds until A is told (or A's Until has passed), so that
			// the overlap, if any, is on the timeline whole.
			var lostAt time.Duration
			select {
			case lostAt = <-aLost:
			case <-time.After(time.Until(a.Until()) + time.Second):
				lostAt = NeverLost
			}
			aErr := <-aDone
			bTo := rec.Now()
			bUntil := rec.At(b.Until())
			if err := b.Release(ctx); err != nil {
				t.Logf("B's release: %v", err)
			}
			rec.AddHold(Hold{Holder: "b", Fence: b.Fence(), From: bFrom, To: min(bTo, bUntil), Until: bUntil, LostAt: NeverLost})
			endCut()

			if !aValid {
				violations = append(violations, "A was no longer valid when B was granted: no double grant, the attack did not run")
			}
			if !errors.Is(aErr, redlease.ErrLost) {
				violations = append(violations, fmt.Sprintf("A was not told of the loss: %v", aErr))
			}
			lostNote := "A's Lost never closed"
			if lostAt != NeverLost {
				lostNote = fmt.Sprintf("A's Lost closed %s after B's grant", fmtMS(lostAt-bFrom))
			}
			figures := fmt.Sprintf("figures: B granted %s after the promotion (TAKEOVER returned; B's client routed K there after %s), A valid=%t with %s left then; %s; fences A %d, B %d; replica lag %d bytes; A granted %s before the promotion",
				fmtMS(bFrom-promoted), fmtMS(routed-promoted), aValid, fmtMS(aUntil-bFrom), lostNote, a.Fence(), b.Fence(), lag, fmtMS(promoted-aGrant))
			t.Log(figures)
			return facts{violations: violations, notes: []string{
				fmt.Sprintf("K's master %s, promoted replica %s", m.Addr, r.Addr), figures}}
		})
}
