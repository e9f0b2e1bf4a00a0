package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/stretchr/testify/require"
)

// 19a and 19b. The failover strategy under the attack of 17, on A's and
// B's own Cluster clients: every grant and extension runs on the key's
// master as one pipeline with WAIT for the replicas its shard lists in
// CLUSTER SHARDS. First the replica is cut (redistest.Cluster.
// StopReplication) and A tries K: the grant must be refused (errors.Is
// ErrNotReplicated and redlease.ErrUnavailable, not ErrNotObtained) and
// leave no key on the master. Replication resumes, A takes K (the replica
// must hold A's token at once: WAIT said so), the replica is cut again and
// A's watchdog renews on the master (K's PTTL there rises) without the
// replica's acknowledgement. Then the replica takes over (CLUSTER FAILOVER
// TAKEOVER) and B tries K every 20 ms:
//
//   - 19a, after two renewals reached the master: the replica still has
//     A's key, and A's Until at the takeover must be no later than K's
//     expiry on it (no extension the replica missed moved it). A is kept,
//     renewed on the new master, or told of its loss before any grant to B.
//   - 19b, once the replica's copy of K has expired: A must no longer be
//     valid then (its renewals were undecided, so its Until is the one the
//     replica acknowledged), and B, granted on the new master, must be
//     granted after A was told (Lost closed), with a fence above A's.
//
// Both require no overlap (O2). The attack must have run: the scenario
// fails (FAIL) when the replica did not hold A's token or was not behind at
// the takeover, when no renewal of A reached the master after the cut,
// when (19b) B was never granted, or (t.Fatal) when A was never granted or
// the takeover did not happen.
func TestScenario19FailoverClusterFailoverBeforeReplication(t *testing.T) {
	for _, expired := range []bool{false, true} {
		name := map[bool]string{false: "19a failover: Cluster failover before replication, renewals unacknowledged",
			true: "19b failover: Cluster failover before replication, the replica's copy expired"}[expired]
		t.Run(map[bool]string{false: "renewals unacknowledged", true: "replica's copy expired"}[expired], func(t *testing.T) {
			run(t, scenario{name: name, strategy: "failover + Cluster (3 masters, 3 replicas)",
				faults: "replica's link cut, CLUSTER FAILOVER TAKEOVER", fast: expired},
				func(t *testing.T, rec *Recorder) facts { return failoverBeforeReplication(t, rec, expired) })
		})
	}
}

// failoverBeforeReplication is scenario 19: 19b when expired, else 19a.
func failoverBeforeReplication(t *testing.T, rec *Recorder, expired bool) facts {
	ctx := t.Context()
	cl := redistest.StartClusterWithReplicas(t, 3, 1)
	ca, cb := cl.Client(), cl.Client() // two processes, two clients
	reg := storage(t, rec, "s19")
	w := watchdog(t)
	const ttl = 6 * time.Second
	la := clusterFailoverLocker(t, ca, ttl, redlease.WithKeeper(w))
	lb := clusterFailoverLocker(t, cb, ttl)
	const key, lockKey = "s19", "chaos:s19"
	m := cl.MasterOf(ctx, ca, lockKey)
	r := cl.ReplicaOf(m)
	cl.WaitRoute(cb, lockKey, m)
	mc := m.Client()
	probe := redistest.StartStallProbe(t)
	var violations []string

	// The replica cut before the grant: refused, nothing left behind.
	endCut1 := fault(rec, "replica's link cut (grant tried after the cut)")
	cl.StopReplication(m, r)
	tried := time.Now()
	refused, cutErr := la.TryLock(ctx, key)
	refusedTook := time.Since(tried)
	switch err := cutErr; {
	case err == nil:
		violations = append(violations, fmt.Sprintf("A was granted K (fence %d) with its master's only replica cut off", refused.Fence()))
		_ = refused.Release(ctx)
	case !errors.Is(err, failover.ErrNotReplicated) || !errors.Is(err, redlease.ErrUnavailable) || errors.Is(err, redlease.ErrNotObtained):
		violations = append(violations, fmt.Sprintf("A's grant with the replica cut was refused, but not as unreplicated (want ErrNotReplicated and ErrUnavailable, not ErrNotObtained): %v", err))
	default:
		rec.Failure("a", err)
	}
	left, gerr := mc.Get(ctx, lockKey).Result()
	pttl, perr := mc.Do(ctx, "PTTL", lockKey).Int64()
	if !errors.Is(gerr, redis.Nil) || perr != nil || pttl != -2 {
		violations = append(violations, fmt.Sprintf("the refused grant left K on the master: GET %q (%v), PTTL %d (%v)", left, gerr, pttl, perr))
	}
	cl.ResumeReplication(m, r)
	endCut1()

	// The replica healthy: A's grant is acknowledged, so the replica has it.
	a := lockWithin(ctx, t, probe, la, key)
	aFrom := rec.Now()
	stopKeep := w.Keep(a)
	defer stopKeep()
	aLostAt, stopWatch := watchLost(rec, a)
	defer stopWatch()
	_, _ = reg.Write(ctx, "a", a.Fence(), 1)
	if got, err := r.ReadOnlyGet(ctx, lockKey); err != nil || got != a.Token() {
		violations = append(violations, fmt.Sprintf("the replica did not hold A's acknowledged grant (%q, %v): the attack did not run", got, err))
	}

	endCut := fault(rec, "replica's link cut")
	cl.StopReplication(m, r)
	cut := rec.Now()
	untilAtCut := a.Until()
	// A's watchdog renews on the master, which the replica cannot
	// acknowledge: K's PTTL there rises. The watchdog sends one batch at a
	// time, so once a second renewal reached the master the first one's
	// verdict is in.
	last, renewals := masterPTTL(ctx, mc, lockKey), 0
	soft := &redistest.SoftTB{TB: t}
	probe.WaitFor(soft, 2*(ttl/3)+time.Second, 3, 5*time.Millisecond, func() bool {
		cur := masterPTTL(ctx, mc, lockKey)
		if cur > last {
			renewals++
		}
		last = cur
		return renewals >= 2 || !a.Valid()
	}, "two renewals of A to reach master %s after the cut", m.Addr)
	renewedAt := rec.Now()
	if renewals == 0 {
		violations = append(violations, fmt.Sprintf("no renewal of A reached the master after the cut (A's error: %v; %s): the attack did not run", a.Err(), soft.Failed()))
	}
	if expired {
		// Until the replica's copy of K has expired: from then on only an
		// extension the replica never saw can keep A valid.
		soft := &redistest.SoftTB{TB: t}
		probe.WaitFor(soft, time.Until(untilAtCut)+time.Second, 3, 10*time.Millisecond, func() bool {
			ms, err := readOnlyPTTL(ctx, r, lockKey)
			return err == nil && ms == -2
		}, "the replica's copy of K to expire")
		if soft.Failed() != "" {
			violations = append(violations, "the replica's copy of K did not expire: "+soft.Failed())
		}
		if a.Valid() {
			violations = append(violations, fmt.Sprintf("A still valid (%s left) with its key expired on the replica: an extension the replica never received moved its Until", fmtMS(time.Until(a.Until()))))
		}
	}

	lag := cl.Lag(m, r)
	untilAtTakeover := a.Until()
	rTTL, rerr := readOnlyPTTL(ctx, r, lockKey)
	readAt := time.Now()
	if lag <= 0 {
		violations = append(violations, fmt.Sprintf("the replica was not behind when promoted (lag %d bytes): the attack did not run", lag))
	}
	headroom := readAt.Add(rTTL).Sub(untilAtTakeover)
	switch {
	case expired:
	case rerr != nil || rTTL < 0:
		violations = append(violations, fmt.Sprintf("the replica did not hold K before the takeover (PTTL %v, %v)", rTTL, rerr))
	case headroom < -time.Millisecond:
		violations = append(violations, fmt.Sprintf("A's Until at the takeover was %s past K's expiry on the replica: an extension the replica never received moved it", fmtMS(-headroom)))
	}

	endTake := fault(rec, "CLUSTER FAILOVER TAKEOVER")
	promoted := rec.At(cl.Takeover(r, cb, lockKey))
	endTake()

	// B tries K until A's Until at the takeover plus half a TTL (19a), or
	// until granted, at most a TTL (19b).
	end := untilAtTakeover.Add(ttl / 2)
	if expired {
		end = time.Now().Add(ttl)
	}
	var (
		b                 *redlease.Lock
		bFrom             time.Duration
		bTries, bHeld     int
		aToldAtB, aValidB bool
	)
	for bTries < 5000 && time.Now().Before(end) {
		bTries++
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		lk, err := lb.TryLock(tctx, key)
		cancel()
		if err == nil {
			b, bFrom = lk, rec.Now()
			aToldAtB, aValidB = closed(a.Lost()), a.Valid()
			break
		}
		if errors.Is(err, redlease.ErrNotObtained) {
			bHeld++
		}
		sleep(ctx, 20*time.Millisecond)
	}
	if b != nil {
		_, _ = reg.Write(ctx, "b", b.Fence(), 1)
		sleep(ctx, 100*time.Millisecond)
		bTo := rec.Now()
		if err := b.Release(ctx); err != nil {
			t.Logf("B's release: %v", err)
		}
		rec.AddHold(Hold{Holder: "b", Fence: b.Fence(), From: bFrom, To: min(bTo, rec.At(b.Until())), Until: rec.At(b.Until()), LostAt: NeverLost})
		if !aToldAtB {
			violations = append(violations, fmt.Sprintf("B was granted K %s after the takeover before A was told of its loss (A valid %t)", fmtMS(bFrom-promoted), aValidB))
		}
		if b.Fence() <= a.Fence() {
			violations = append(violations, fmt.Sprintf("B's fence %d is not above A's %d", b.Fence(), a.Fence()))
		}
	} else if expired {
		violations = append(violations, fmt.Sprintf("B was never granted K in %d tries over a TTL after the takeover: the attack did not run", bTries))
	}
	stopWatch()
	stopKeep()
	lostAt := aLostAt()
	aTo := min(rec.Now(), rec.At(a.Until()))
	if lostAt != NeverLost {
		aTo = min(aTo, lostAt)
	}
	rec.AddHold(Hold{Holder: "a", Fence: a.Fence(), From: aFrom, To: aTo, Until: rec.At(a.Until()), LostAt: lostAt})
	_ = a.Release(ctx)
	endCut()

	outcome := fmt.Sprintf("A's Lost never closed (its Until moved %s past the one at the takeover)", fmtMS(a.Until().Sub(untilAtTakeover)))
	if lostAt != NeverLost {
		outcome = fmt.Sprintf("A told of its loss %s (%v)", relative(lostAt-promoted, "the takeover"), a.Err())
	}
	bNote := fmt.Sprintf("B never granted in %d tries (%d refused as held)", bTries, bHeld)
	if b != nil {
		bNote = fmt.Sprintf("B granted %s after the takeover, try %d, fence %d (A's %d)", fmtMS(bFrom-promoted), bTries, b.Fence(), a.Fence())
	}
	replica := fmt.Sprintf("A's Until then %s before K's expiry on the replica", fmtMS(headroom))
	if expired {
		replica = fmt.Sprintf("K expired on the replica, A's Until %s", relative(untilAtTakeover.Sub(readAt), "then"))
	}
	figures := fmt.Sprintf("figures: grant with the replica cut refused in %s (%v); %d renewals of A reached the master in the %s after the cut, A's Until moved %s since the cut; replica lag %d bytes at the takeover, %s after the cut; %s; %s; %s",
		fmtMS(refusedTook), cutErr, renewals, fmtMS(renewedAt-cut), fmtMS(untilAtTakeover.Sub(untilAtCut)), lag, fmtMS(promoted-cut), replica, outcome, bNote)
	t.Log(figures)
	return facts{violations: violations, notes: []string{
		fmt.Sprintf("K's master %s, promoted replica %s", m.Addr, r.Addr), figures}}
}

// 20. The failover strategy under the fault of 18: A's grant is
// acknowledged by the replica (checked at once: WAIT said so), the master
// is killed (SIGKILL) and the cluster promotes the replica on its own
// (cluster-node-timeout 2 s on every node). A keeps the lock past its
// Until at the promotion plus half a TTL, renewed on the new master, and
// B, trying K every 200 ms meanwhile, is never granted it. The log gives
// what CLUSTER SHARDS on the new master lists after the promotion (whose
// replicas the renewals there wait for), and again once the old master
// is restarted and rejoins as its replica, with whether A's renewals
// were acknowledged then.
//
// The attack must have run: the scenario fails (FAIL) when the replica did
// not hold A's token before the kill, and (t.Fatal) when the replica was
// not promoted within 30 s.
func TestScenario20FailoverClusterFailoverAfterReplication(t *testing.T) {
	run(t, scenario{name: "20 failover: Cluster master killed after replication", strategy: "failover + Cluster (3 masters, 3 replicas)",
		faults: "SIGKILL master, automatic failover"},
		func(t *testing.T, rec *Recorder) facts {
			ctx := t.Context()
			cl := redistest.StartClusterWithReplicas(t, 3, 1)
			for _, s := range cl.Servers() {
				if err := s.Client().ConfigSet(ctx, "cluster-node-timeout", "2000").Err(); err != nil {
					t.Fatalf("CONFIG SET cluster-node-timeout on %s: %v", s.Addr, err)
				}
			}
			ca, cb := cl.Client(), cl.Client()
			reg := storage(t, rec, "s20")
			w := watchdog(t)
			const ttl = 10 * time.Second
			la := clusterFailoverLocker(t, ca, ttl, redlease.WithKeeper(w))
			lb := clusterFailoverLocker(t, cb, ttl)
			const key, lockKey = "s20", "chaos:s20"
			probe := redistest.StartStallProbe(t)
			var violations []string

			a := lockWithin(ctx, t, probe, la, key)
			aFrom := rec.Now()
			stopKeep := w.Keep(a)
			defer stopKeep()
			aLostAt, stopWatch := watchLost(rec, a)
			defer stopWatch()
			_, _ = reg.Write(ctx, "a", a.Fence(), 1)
			m := cl.MasterOf(ctx, ca, lockKey)
			r := cl.ReplicaOf(m)
			if got, err := r.ReadOnlyGet(ctx, lockKey); err != nil || got != a.Token() {
				violations = append(violations, fmt.Sprintf("the replica did not hold A's acknowledged grant before the kill (%q, %v): the attack did not run", got, err))
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
			shardsDead, replicasDead := shardsSeenBy(ctx, rc, r.Addr)

			// B tries K until past A's Until at the promotion plus half a
			// TTL: never granted while A holds it.
			end := untilAtPromotion.Add(ttl / 2)
			bTries, bGrants := 0, 0
			for bTries < 1000 && time.Now().Before(end) {
				bTries++
				tctx, cancel := context.WithTimeout(ctx, time.Second)
				b, err := lb.TryLock(tctx, key)
				cancel()
				if err == nil {
					bGrants++
					bFrom := rec.Now()
					_, _ = reg.Write(ctx, "b", b.Fence(), 1)
					bTo := rec.Now()
					_ = b.Release(ctx)
					rec.AddHold(Hold{Holder: "b", Fence: b.Fence(), From: bFrom, To: max(bTo, bFrom+time.Millisecond), Until: rec.At(b.Until()), LostAt: NeverLost})
				}
				sleep(ctx, 200*time.Millisecond)
			}
			lostAt := aLostAt()
			if lostAt != NeverLost || !a.Valid() {
				violations = append(violations, fmt.Sprintf("A lost the lock although the promoted replica held it: %v", a.Err()))
			}
			if !a.Until().After(untilAtPromotion) {
				violations = append(violations, "A's lock was not renewed on the new master")
			}
			untilBeforeRestart := a.Until()

			// The old master back: it rejoins as the new master's replica,
			// which renewals there then wait for.
			restarted := rec.Now()
			m.Restart()
			var shardsBack string
			replicasBack := 0
			soft := &redistest.SoftTB{TB: t}
			probe.WaitFor(soft, 5*time.Second, 3, 50*time.Millisecond, func() bool {
				shardsBack, replicasBack = shardsSeenBy(ctx, rc, r.Addr)
				return replicasBack > 0 || !a.Valid()
			}, "the new master %s to list the restarted %s as its replica", r.Addr, m.Addr)
			rejoinedAt, rejoined := rec.Now(), replicasBack > 0
			// Half a TTL (the watchdog renews every third) for a renewal
			// that the rejoined replica acknowledged.
			renewedBack := false
			probe.WaitFor(soft, ttl/2, 3, 50*time.Millisecond, func() bool {
				renewedBack = a.Until().After(untilBeforeRestart)
				return renewedBack || !a.Valid()
			}, "a renewal of A on %s after %s rejoined", r.Addr, m.Addr)
			if rejoined && !renewedBack {
				violations = append(violations, fmt.Sprintf("A was not renewed on the new master once the old one rejoined as its replica: %s", soft.Failed()))
			}
			stopWatch()
			stopKeep()
			if lostAt = aLostAt(); lostAt != NeverLost {
				violations = append(violations, fmt.Sprintf("A lost the lock after the old master rejoined as a replica: %v", a.Err()))
			}
			aTo := min(rec.Now(), rec.At(a.Until()))
			if lostAt != NeverLost {
				aTo = min(aTo, lostAt)
			}
			rec.AddHold(Hold{Holder: "a", Fence: a.Fence(), From: aFrom, To: aTo, Until: rec.At(a.Until()), LostAt: lostAt})
			_ = a.Release(ctx)

			figures := fmt.Sprintf("figures: promoted %s after the kill; A's Until at the promotion %s later, renewed to %s past it; B tried %d times, granted %d; restarted old master listed as replica %t %s after its restart, A renewed since: %t",
				fmtMS(promoted-killed), fmtMS(rec.At(untilAtPromotion)-promoted), fmtMS(untilBeforeRestart.Sub(untilAtPromotion)), bTries, bGrants,
				rejoined, fmtMS(rejoinedAt-restarted), renewedBack)
			t.Log(figures)
			t.Logf("CLUSTER SHARDS on the new master %s, old master %s dead (%d replicas in its shard): %s", r.Addr, m.Addr, replicasDead, shardsDead)
			t.Logf("CLUSTER SHARDS on the new master %s, old master %s restarted (%d replicas in its shard): %s", r.Addr, m.Addr, replicasBack, shardsBack)
			return facts{violations: violations, notes: []string{
				fmt.Sprintf("K's master %s, promoted replica %s", m.Addr, r.Addr), figures,
				fmt.Sprintf("CLUSTER SHARDS on the new master after the promotion: %s; after the old master's restart: %s", shardsDead, shardsBack)}}
		})
}

// clusterFailoverLocker is a Locker on the failover strategy over the
// Cluster client cc, with the scenarios' prefix and ttl; the strategy is
// closed on cleanup and a constructor's error fails t.
func clusterFailoverLocker(t *testing.T, cc *redis.ClusterClient, ttl time.Duration, opts ...redlease.Option) *redlease.Locker {
	t.Helper()
	s, err := failover.New(cc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	l, err := redlease.New(s, append([]redlease.Option{redlease.WithTTL(ttl), redlease.WithPrefix("chaos:")}, opts...)...)
	require.NoError(t, err)
	return l
}

// watchLost records when lk's Lost closes (at returns NeverLost until it
// has), until stop, which waits for the watching goroutine and may be
// called more than once. Stop it before releasing lk: a release closes
// Lost too.
func watchLost(rec *Recorder, lk *redlease.Lock) (at func() time.Duration, stop func()) {
	var lostAt atomic.Int64
	lostAt.Store(int64(NeverLost))
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-lk.Lost():
			lostAt.Store(int64(rec.Now()))
		case <-quit:
		}
	}()
	var once sync.Once
	return func() time.Duration { return time.Duration(lostAt.Load()) },
		func() { once.Do(func() { close(quit); <-done }) }
}

// relative says d from what: "1.5ms after the takeover" or, for a
// negative d, "1.5ms before" it.
func relative(d time.Duration, what string) string {
	if d < 0 {
		return fmtMS(-d) + " before " + what
	}
	return fmtMS(d) + " after " + what
}

// closed reports whether c is closed.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// masterPTTL is key's PTTL in milliseconds on c (-2: no key; -3: no
// answer).
func masterPTTL(ctx context.Context, c *redis.Client, key string) int64 {
	v, err := c.Do(ctx, "PTTL", key).Int64()
	if err != nil {
		return -3
	}
	return v
}

// readOnlyPTTL is key's PTTL on s read as a Cluster replica serves reads
// (READONLY, then PTTL, on one connection); negative when s has no such
// key (-2) or it has no TTL (-1).
func readOnlyPTTL(ctx context.Context, s *redistest.Server, key string) (time.Duration, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	conn := c.Conn()
	defer conn.Close()
	if err := conn.ReadOnly(ctx).Err(); err != nil {
		return 0, err
	}
	ms, err := conn.Do(ctx, "PTTL", key).Int64()
	if ms < 0 {
		return time.Duration(ms), err
	}
	return time.Duration(ms) * time.Millisecond, err
}

// shardsSeenBy is CLUSTER SHARDS as c answers it, one bracket per shard
// (slots, then each node's port, role and health; the shard of the node
// at self marked), and how many replicas it lists in that shard.
func shardsSeenBy(ctx context.Context, c *redis.Client, self string) (string, int) {
	shards, err := c.ClusterShards(ctx).Result()
	if err != nil {
		return "CLUSTER SHARDS: " + err.Error(), 0
	}
	var out []string
	replicas := 0
	for _, sh := range shards {
		var b strings.Builder
		b.WriteString("slots")
		if len(sh.Slots) == 0 {
			b.WriteString(" none")
		}
		for _, sl := range sh.Slots {
			fmt.Fprintf(&b, " %d-%d", sl.Start, sl.End)
		}
		mine, n := false, 0
		for _, nd := range sh.Nodes {
			fmt.Fprintf(&b, ", %d %s %s", nd.Port, nd.Role, nd.Health)
			mine = mine || net.JoinHostPort(nd.IP, strconv.FormatInt(nd.Port, 10)) == self
			if nd.Role == "replica" {
				n++
			}
		}
		if mine {
			replicas = n
			out = append(out, "[its own shard: "+b.String()+"]")
		} else {
			out = append(out, "["+b.String()+"]")
		}
	}
	return strings.Join(out, " "), replicas
}
