package chaos

import (
	"context"
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

// 18. single on a Redis Cluster of 3 masters with a replica each, a master
// killed after replication: the replica has A's lock when the cluster
// promotes it on its own (cluster-node-timeout set to 2 s on every node,
// so that it does within seconds). A's client is told nothing (the dead
// master answers no MOVED); the library marks the silent master, asks
// go-redis to reload its topology, and renews on the new master: A keeps
// the lock past the Until it had at the promotion plus half a TTL, renewed
// there, and B, trying the key meanwhile, is never granted it.
//
// The attack must have run: the scenario fails (FAIL) when the replica did
// not hold A's token before the kill or was not promoted within 30 s.
func TestScenario18SingleClusterFailoverAfterReplication(t *testing.T) {
	run(t, scenario{name: "18 single: Cluster master killed after replication", strategy: "single + Cluster (3 masters, 3 replicas)",
		faults: "SIGKILL master, automatic failover", exp: Expectation{}},
		func(t *testing.T, rec *Recorder) facts {
			ctx := t.Context()
			cl := redistest.StartClusterWithReplicas(t, 3, 1)
			for _, s := range cl.Servers() {
				if err := s.Client().ConfigSet(ctx, "cluster-node-timeout", "2000").Err(); err != nil {
					t.Fatalf("CONFIG SET cluster-node-timeout on %s: %v", s.Addr, err)
				}
			}
			ca, cb := cl.Client(), cl.Client()
			reg := storage(t, rec, "s18")
			w := watchdog(t)
			const ttl = 10 * time.Second
			la := sentinelLocker(t, ca, ttl, redlease.WithKeeper(w))
			lb := sentinelLocker(t, cb, ttl)
			const key, lockKey = "s18", "chaos:s18"
			probe := redistest.StartStallProbe(t)
			var violations []string

			a, err := la.TryLock(ctx, key)
			if err != nil {
				t.Fatalf("A's lock: %v", err)
			}
			stop := w.Keep(a)
			defer stop()
			aFrom := rec.Now()
			aLost := make(chan time.Duration, 1)
			go func() {
				select {
				case <-a.Lost():
					aLost <- rec.Now()
				case <-ctx.Done():
				}
			}()
			_, _ = reg.Write(ctx, "a", a.Fence(), 1)
			m := cl.MasterOf(ctx, ca, lockKey)
			r := cl.ReplicaOf(m)
			probe.WaitFor(t, 5*time.Second, 3, 5*time.Millisecond, func() bool { return cl.Lag(m, r) == 0 },
				"replica %s to catch up with %s", r.Addr, m.Addr)
			if got, err := r.ReadOnlyGet(ctx, lockKey); err != nil || got != a.Token() {
				violations = append(violations, fmt.Sprintf("the replica did not hold A's token before the kill (%q, %v): the attack did not run", got, err))
			}

			endKill := fault(rec, "SIGKILL master, automatic failover")
			killed := rec.Now()
			m.Kill()
			rc := r.Client()
			probe.WaitFor(t, 30*time.Second, 3, 50*time.Millisecond, func() bool {
				role, err := rc.Do(ctx, "ROLE").Slice()
				return err == nil && len(role) > 0 && role[0] == "master"
			}, "replica %s to be promoted after its master %s was killed", r.Addr, m.Addr)
			promoted := rec.Now()
			endKill()
			untilAtPromotion := a.Until()

			// B tries the key until past A's Until at the promotion plus half
			// a TTL: never granted while A holds it.
			end := untilAtPromotion.Add(ttl / 2)
			bTries := 0
			for time.Now().Before(end) {
				bTries++
				tctx, cancel := context.WithTimeout(ctx, time.Second)
				b, err := lb.TryLock(tctx, key)
				cancel()
				if err == nil {
					rec.AddHold(Hold{Holder: "b", Fence: b.Fence(), From: rec.Now(), To: rec.Now(), Until: rec.At(b.Until()), LostAt: NeverLost})
					_, _ = reg.Write(ctx, "b", b.Fence(), 1)
					_ = b.Release(ctx)
				}
				time.Sleep(200 * time.Millisecond)
			}
			lost, lostAt := false, NeverLost
			select {
			case lostAt = <-aLost:
				lost = true
			default:
			}
			if lost || !a.Valid() {
				violations = append(violations, fmt.Sprintf("A lost the lock although the promoted replica held it: %v", a.Err()))
			}
			if !a.Until().After(untilAtPromotion) {
				violations = append(violations, "A's lock was not renewed on the new master")
			}
			aTo := min(rec.Now(), rec.At(a.Until()))
			if lost {
				aTo = min(aTo, lostAt)
			}
			rec.AddHold(Hold{Holder: "a", Fence: a.Fence(), From: aFrom, To: aTo, Until: rec.At(a.Until()), LostAt: lostAt})
			stop()
			_ = a.Release(ctx)
			figures := fmt.Sprintf("figures: promoted %s after the kill; A's Until at the promotion %s later, renewed to %s past it; lost %v; B tried %d times",
				fmtMS(promoted-killed), fmtMS(rec.At(untilAtPromotion)-promoted), fmtMS(rec.At(a.Until())-rec.At(untilAtPromotion)), lost, bTries)
			t.Log(figures)
			return facts{violations: violations, notes: []string{fmt.Sprintf("K's master %s, promoted replica %s", m.Addr, r.Addr), figures}}
		})
}
