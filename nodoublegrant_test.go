package redlease_test

// Attacks on mutual exclusion, each with a forced order of events: requests
// and replies held in a Gate (a proxy the test steps through), processes
// killed and restarted. None of them races a sleep against a sleep. Each
// failed on the code before its fix; the closing note of the issue that
// added them shows that output.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// slowClient is a go-redis client with default options except a read
// timeout long enough that a held request is not given up on by go-redis
// while the test steps the gate (the scenario does not depend on go-redis
// giving up; the round deadline of the strategy is what expires).
func slowClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: 30 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Defect 1, quorum. Lock retries after a failed attempt; the failed
// attempt's undo runs when its node answers, which can be after the next
// attempt counted that node. Forced order on each of nodes 0–2 (3 and 4 are
// down): attempt 1's acquire is held until attempt 1 has failed and attempt
// 2's acquire is held behind it; then attempt 1's acquire is applied, then
// attempt 2's, then attempt 1's undo. When all attempts share a token,
// attempt 2 counts nodes whose key the undo then deletes, and a second
// client is granted the lock while the first still holds it.
func TestRetryUndoCannotDeleteALaterAttemptsKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	servers := redistest.StartN(t, 5, redistest.Config{})
	gates := make([]*redistest.Gate, 5)
	clients := make([]redis.UniversalClient, 5)
	for i, s := range servers {
		loadScripts(t, s.Client())
		gates[i] = redistest.NewGate(t, s.Addr)
		clients[i] = slowClient(t, gates[i].Addr)
		require.NoError(t, clients[i].Ping(ctx).Err())
	}
	const key = "attack:retry-undo"
	for i := 0; i < 3; i++ {
		gates[i].HoldRequests(key)
	}
	servers[3].Kill()
	servers[4].Kill()

	// A round lasts 1 s, so each step below has most of a second, and the
	// retry comes at once.
	qa := quorumOver(t, clients, quorum.WithNodeTimeout(time.Second))
	la, err := redlease.New(qa, redlease.WithTTL(20*time.Second), redlease.WithRetryDelay(time.Millisecond, time.Millisecond))
	require.NoError(t, err)
	got := lockAsync(ctx, la, key)

	acquireSHA, releaseSHA := script.Acquire.Hash(), script.Release.Hash()
	// Attempt 1 failed (its round expired with no votes) and attempt 2's
	// acquire is held behind attempt 1's on each live node.
	for i := 0; i < 3; i++ {
		require.NoError(t, gates[i].WaitHeld(2, acquireSHA, 10*time.Second), "node %d", i)
	}
	for i := 0; i < 3; i++ {
		// Attempt 1's acquire reaches node i; its reply makes the failed
		// attempt send its undo, which the gate holds too.
		require.NoError(t, gates[i].Step(acquireSHA, 10*time.Second), "node %d", i)
		require.NoError(t, gates[i].WaitHeld(1, releaseSHA, 10*time.Second), "node %d: the failed attempt's undo", i)
	}
	for i := 0; i < 3; i++ {
		// Attempt 2's acquire, before attempt 1's undo.
		require.NoError(t, gates[i].Step(acquireSHA, 10*time.Second), "node %d", i)
	}
	for i := 0; i < 3; i++ {
		// Now the undo lands, and from here on everything flows.
		require.NoError(t, gates[i].Step(releaseSHA, 10*time.Second), "node %d", i)
		gates[i].Open()
	}
	r := <-got
	require.NoError(t, r.err)
	a := r.lk

	// Nodes 3 and 4 come back (empty). While A's lock is valid, nobody else
	// may get it.
	servers[3].Restart()
	servers[4].Restart()
	qb := quorumOver(t, directClients(t, servers))
	lb, err := redlease.New(qb, redlease.WithTTL(20*time.Second))
	require.NoError(t, err)
	var holders []string
	for i, s := range servers[:3] {
		v, _ := s.Client().Get(ctx, key).Result()
		holders = append(holders, fmt.Sprintf("node %d: %q", i, v))
	}
	require.True(t, a.Valid(), "A's lock must still be valid for the check to mean anything")
	b, err := lb.TryLock(ctx, key)
	if err == nil {
		t.Fatalf("double grant: B got the lock (fence %d) while A's is valid for %v more; keys on nodes 0-2 (A's token %q): %s",
			b.Fence(), time.Until(a.Until()).Round(time.Millisecond), a.Token(), strings.Join(holders, ", "))
	}
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	require.True(t, a.Valid())
	require.NoError(t, a.Release(ctx))
}

// Defect 1, the one-primary shape (internal/primary). The failover strategy
// takes the key and then learns that no replica acknowledged it, so it
// undoes the grant. That undo times out in the client but is applied later
// (held in the gate). Meanwhile Lock retries and is granted; then the stale
// undo lands. When attempts share a token it deletes the new grant's key,
// and a second client takes the lock while the first still holds it.
func TestUnreplicatedGrantUndoCannotDeleteALaterAttemptsKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	primary := redistest.Start(t, redistest.Config{})
	replica := redistest.StartReplica(t, primary, redistest.Config{})
	loadScripts(t, primary.Client())
	gate := redistest.NewGate(t, primary.Addr)
	// The undo gives up after 300 ms, like a client timeout; no retries, so
	// it is sent exactly once.
	c := redis.NewClient(&redis.Options{Addr: gate.Addr, ReadTimeout: 300 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.Ping(ctx).Err())
	const key = "attack:wait-undo"
	fa, err := failover.New(c, failover.WithWaitTimeout(50*time.Millisecond))
	require.NoError(t, err)
	la, err := redlease.New(fa, redlease.WithTTL(20*time.Second), redlease.WithRetryDelay(time.Millisecond, time.Millisecond))
	require.NoError(t, err)

	gate.HoldRequests(key)
	replica.Pause()
	got := lockAsync(ctx, la, key)
	acquireSHA, releaseSHA := script.Acquire.Hash(), script.Release.Hash()
	// Attempt 1: granted on the primary, not acknowledged (the replica is
	// paused), so it is undone; the undo is held.
	require.NoError(t, gate.WaitHeld(1, acquireSHA, 10*time.Second))
	require.NoError(t, gate.Step(acquireSHA, 10*time.Second))
	require.NoError(t, gate.WaitHeld(1, releaseSHA, 10*time.Second))
	replica.Resume()
	// The undo times out in the client; attempt 2 comes, and is applied
	// before the stale undo.
	require.NoError(t, gate.WaitHeld(1, acquireSHA, 10*time.Second))
	require.NoError(t, gate.Step(acquireSHA, 10*time.Second))
	require.NoError(t, gate.Step(releaseSHA, 10*time.Second))
	gate.Open()
	r := <-got
	require.NoError(t, r.err)
	a := r.lk

	lb := singleLocker(t, primary.Client(), redlease.WithTTL(20*time.Second))
	require.True(t, a.Valid())
	b, err := lb.TryLock(ctx, key)
	if err == nil {
		t.Fatalf("double grant: B got the lock (fence %d) while A's (fence %d) is valid for %v more",
			b.Fence(), a.Fence(), time.Until(a.Until()).Round(time.Millisecond))
	}
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	require.NoError(t, a.Release(ctx))
}

// ageMarkers waits until every server votes under the delayed-restart
// rule with maxTTL: within 10 s, widened by 3 × the stall this run
// measured meanwhile (probe.WaitFor, polling a server-side rule every
// 20 ms, not racing it). Each is asked on its own (a quorum of one), since
// a round that reaches a majority says nothing about the others, whose
// requests may not even have been sent.
func ageMarkers(t *testing.T, servers []*redistest.Server, maxTTL time.Duration) {
	t.Helper()
	probe := redistest.StartStallProbe(t)
	defer probe.Stop()
	errs := make([]error, len(servers))
	late := make([]string, len(servers)) // a wait's failure (SoftTB: off the test's goroutine)
	var wg sync.WaitGroup
	for i, s := range servers {
		l, err := redlease.New(quorumOver(t, []redis.UniversalClient{s.Client()}, quorum.WithDelayedRestart(maxTTL)), redlease.WithTTL(maxTTL))
		require.NoError(t, err)
		wg.Go(func() {
			soft := &redistest.SoftTB{TB: t}
			var last error
			probe.WaitFor(soft, 10*time.Second, 3, 20*time.Millisecond, func() bool {
				lk, err := l.TryLock(t.Context(), "attack:age")
				if err != nil {
					last = err
					return false
				}
				errs[i] = lk.Release(t.Context())
				return true
			}, "node %d never started voting (delayed restart, max TTL %v): the last TryLock: %s", i, maxTTL, redistest.Lazy(func() string { return fmt.Sprint(last) }))
			late[i] = soft.Failed()
		})
	}
	wg.Wait()
	for i, err := range errs {
		if late[i] != "" {
			t.Fatal(late[i])
		}
		require.NoError(t, err)
	}
}

// Defect 2. With the delayed-restart rule a node that restarts empty sits
// out maxTTL, which protects only locks that live at most maxTTL. Acquire
// refuses a longer TTL; Extend must too. Forced order: A holds the lock on
// nodes 0 and 1 (2 is down) and extends it past maxTTL; node 0 restarts
// empty and node 2 comes back; once both have sat out maxTTL they form a
// majority without A's key.
func TestExtendRespectsDelayedRestartLimit(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	servers := redistest.StartN(t, 3, redistest.Config{})
	const maxTTL = time.Second
	mk := func() *redlease.Locker {
		locker, err := redlease.New(quorumOver(t, directClients(t, servers), quorum.WithDelayedRestart(maxTTL)),
			redlease.WithTTL(maxTTL), redlease.WithPrefix("attack:"))
		require.NoError(t, err)
		return locker
	}
	la, lb := mk(), mk()
	ageMarkers(t, servers, maxTTL)

	servers[2].Kill()
	a, err := la.TryLock(ctx, "extend")
	require.NoError(t, err)
	extendErr := a.Extend(ctx, 10*maxTTL)

	servers[0].Restart() // empty
	servers[2].Restart() // empty
	deadline := time.Now().Add(5 * maxTTL)
	for time.Now().Before(deadline) {
		b, err := lb.TryLock(ctx, "extend")
		if err == nil {
			if a.Valid() {
				t.Fatalf("double grant: B got the lock while A's is valid for %v more (A's Extend to %v returned %v)",
					time.Until(a.Until()).Round(time.Millisecond), 10*maxTTL, extendErr)
			}
			require.NoError(t, b.Release(ctx))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.ErrorIs(t, extendErr, redlease.ErrInvalid, "an extension past the delayed-restart max TTL must be refused")
	// And in a batch (the watchdog's path).
	q := quorumOver(t, directClients(t, servers), quorum.WithDelayedRestart(maxTTL))
	out := q.ExtendBatch(ctx, []redlease.Extension{{Key: "attack:extend", Token: "t", TTL: 2 * maxTTL}, {Key: "attack:other", Token: "t", TTL: maxTTL}})
	require.ErrorIs(t, out[0].Err, redlease.ErrInvalid)
	require.NotErrorIs(t, out[1].Err, redlease.ErrInvalid)
}

// Defect 3. A node restored from an older snapshot keeps its boot marker
// but forgets newer locks. Forced order: markers aged, node 0 snapshots
// (SAVE), A takes the lock on nodes 0 and 1 (its request to node 2 is held
// in a gate), node 0 restarts from the snapshot. B must not get nodes 0 and
// 2 while A holds the lock.
func TestSnapshotRestoredNodeSitsOut(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	servers := redistest.StartN(t, 3, redistest.Config{})
	const maxTTL = 3 * time.Second
	lb, err := redlease.New(quorumOver(t, directClients(t, servers), quorum.WithDelayedRestart(maxTTL)),
		redlease.WithTTL(maxTTL), redlease.WithPrefix("attack:"))
	require.NoError(t, err)
	ageMarkers(t, servers, maxTTL)

	gate := redistest.NewGate(t, servers[2].Addr)
	gate.HoldRequests("attack:snapshot")
	aClients := directClients(t, servers)
	aClients[2] = redis.NewClient(&redis.Options{Addr: gate.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = aClients[2].Close() })
	la, err := redlease.New(quorumOver(t, aClients, quorum.WithDelayedRestart(maxTTL)),
		redlease.WithTTL(maxTTL), redlease.WithPrefix("attack:"))
	require.NoError(t, err)

	require.NoError(t, servers[0].Client().Save(ctx).Err())
	// Lock, not TryLock: under load a 100 ms node timeout can pass with no
	// reply at all (failed once with load average 10: "0 of 3 nodes
	// agreed"); retries change nothing here (node 2 holds every attempt).
	actx, cancel := context.WithTimeout(ctx, 10*time.Second)
	a, err := la.Lock(actx, "snapshot")
	cancel()
	require.NoError(t, err)
	servers[0].Restart() // from the snapshot: the marker is back, A's key is not
	require.Equal(t, int64(0), servers[0].Client().Exists(ctx, "attack:snapshot").Val())

	require.True(t, a.Valid(), "A's lock must still be valid for the check to mean anything")
	b, err := lb.TryLock(ctx, "snapshot")
	if err == nil {
		t.Fatalf("double grant: B got the lock (token %s) while A's is valid for %v more", b.Token(), time.Until(a.Until()).Round(time.Millisecond))
	}
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	gate.Close() // A's held request to node 2 is dropped, never applied
}

// Defect 4. A Release that fails (ctx cancelled, node slow) may still be
// applied later; the lock must stop claiming validity once a release was
// sent, whatever came back. A retried Release stays allowed.
func TestFailedReleaseEndsValidity(t *testing.T) {
	ctx := t.Context()
	srv, gate, c := gatedServer(t)
	strategy, err := single.New(c)
	require.NoError(t, err)
	la, err := redlease.New(strategy, redlease.WithTTL(20*time.Second))
	require.NoError(t, err)
	lb := singleLocker(t, srv.Client(), redlease.WithTTL(20*time.Second))
	a, err := la.TryLock(ctx, "attack:release")
	require.NoError(t, err)
	lost := a.Lost()

	gate.HoldRequests(script.Release.Hash())
	rctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	relErr := a.Release(rctx)
	cancel()
	require.Error(t, relErr)
	require.NoError(t, gate.Step("", 5*time.Second)) // the release lands after all
	b, err := lb.TryLock(ctx, "attack:release")
	require.NoError(t, err, "the key is gone: B may take it")
	if a.Valid() {
		t.Fatalf("double grant: B holds the lock (fence %d) and A's lock still says Valid (release error: %v)", b.Fence(), relErr)
	}
	require.ErrorIs(t, a.Extend(ctx, time.Second), redlease.ErrNotHeld, "a lock whose release was sent cannot be extended")
	select {
	case <-lost:
	default:
		t.Fatal("Lost not closed after a release was sent")
	}
	require.ErrorIs(t, a.Err(), redlease.ErrLost)
	require.NoError(t, b.Release(ctx))

	// A retried Release is sent again (here it is held, then applied, and
	// reports the key gone).
	a2, err := la.TryLock(ctx, "attack:release2")
	require.NoError(t, err)
	rctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
	require.Error(t, a2.Release(rctx))
	cancel()
	retried := make(chan error, 1)
	go func() { retried <- a2.Release(ctx) }()
	require.NoError(t, gate.WaitHeld(2, "", 5*time.Second), "the retry must be sent")
	require.NoError(t, gate.Step("", 5*time.Second)) // the first one deletes the key
	require.NoError(t, gate.Step("", 5*time.Second)) // the retry finds it gone
	require.ErrorIs(t, <-retried, redlease.ErrNotHeld)
	gate.Open()
}

// Defect 5. The failover Watcher revokes the locks a strategy granted when
// Sentinel moves the primary. A grant whose reply is on its way while the
// revocation runs must be revoked too. Forced order: the reply of the
// acquisition is held, RevokeAll runs (as the Watcher does on
// +switch-master), then the reply arrives.
func TestGrantInFlightDuringFailoverIsRevoked(t *testing.T) {
	ctx := t.Context()
	primary := redistest.Start(t, redistest.Config{})
	redistest.StartReplica(t, primary, redistest.Config{})
	loadScripts(t, primary.Client())
	gate := redistest.NewGate(t, primary.Addr)
	c := redis.NewClient(&redis.Options{Addr: gate.Addr, ContextTimeoutEnabled: true, ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.Ping(ctx).Err())
	fs, err := failover.New(c)
	require.NoError(t, err)
	la, err := redlease.New(fs, redlease.WithTTL(20*time.Second))
	require.NoError(t, err)

	gate.HoldReplies("attack:failover")
	got := make(chan lockResult, 1)
	go func() {
		lk, err := la.TryLock(ctx, "attack:failover")
		got <- lockResult{lk, err}
	}()
	require.NoError(t, gate.WaitHeld(1, "", 10*time.Second))
	fs.RevokeAll(fmt.Errorf("%w: test: primary moved", failover.ErrFailover))
	gate.Open()
	r := <-got
	// The grant is revoked as it is made: not obtained (since a lock born
	// lost is given back at once), for the failover.
	if r.lk != nil && r.lk.Valid() {
		t.Fatal("a grant in flight during a failover is still valid after the Watcher revoked every lock")
	}
	require.Nil(t, r.lk)
	require.ErrorIs(t, r.err, redlease.ErrNotObtained)
	require.ErrorIs(t, r.err, failover.ErrFailover)
}

// Defect 7. A lock key may not be one of redlease's own keys: a lock on
// another lock's fence counter, or on a node's boot marker, corrupts it.
func TestLockKeysCannotEnterReservedNamespace(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := redistest.Start(t, redistest.Config{})
	servers := redistest.StartN(t, 3, redistest.Config{})
	ls := singleLocker(t, srv.Client(), redlease.WithTTL(time.Second))
	lq, err := redlease.New(quorumOver(t, directClients(t, servers), quorum.WithDelayedRestart(time.Second), quorum.WithFencing()),
		redlease.WithTTL(time.Second))
	require.NoError(t, err)
	fk, ok := script.FenceKey("a")
	require.True(t, ok)
	for _, c := range []struct {
		name string
		l    *redlease.Locker
		key  string
	}{
		{"single: another lock's fence counter", ls, fk},
		{"quorum: another lock's fence counter", lq, fk},
		{"quorum: the boot marker", lq, script.BootMarker},
		{"single: anything under the reserved prefix", ls, redlease.ReservedPrefix + "x"},
	} {
		t.Run(c.name, func(t *testing.T) {
			lk, err := c.l.TryLock(ctx, c.key)
			if err == nil {
				_ = lk.Release(ctx)
			}
			require.ErrorIs(t, err, redlease.ErrInvalid, "lock key %q", c.key)
		})
	}
	// A Locker prefix that puts every key there is refused too.
	locker := singleLocker(t, srv.Client(), redlease.WithPrefix(redlease.ReservedPrefix))
	_, err = locker.TryLock(ctx, "k")
	require.ErrorIs(t, err, redlease.ErrInvalid)
}

// Found by the simulator (chaos/sim, seed 204 of quorum5-fenced). An Extend
// to a TTL shorter than the validity left whose reply never comes (ctx
// ended) may still be applied. The lock counts on no more than its start
// plus the shorter TTL from the moment it is sent; the node, which never
// shortens a held key, keeps the key's longer life, so others wait for
// that (or for a Release). Forced order: the extension is held in the
// gate until its caller gave up, then applied; the lock is lost by its
// own deadline while the key lives on; B is refused until A releases.
func TestUndecidedShorterExtendShortensValidity(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	ctx := t.Context()
	srv, gate, c := gatedServer(t)
	// A 50 ms loss margin: the default (2 s, a tenth of the TTL) would have
	// the 300 ms Extend refused before it is sent (ErrInvalid: the lock
	// would be lost at once).
	la := singleLocker(t, c, redlease.WithTTL(20*time.Second), redlease.WithLossMargin(50*time.Millisecond))
	lb := singleLocker(t, srv.Client(), redlease.WithTTL(20*time.Second))
	const key = "attack:shortextend"
	asked := time.Now()
	a, err := la.TryLock(ctx, key)
	require.NoError(t, err)
	lost := a.Lost()

	gate.HoldRequests(script.Extend.Hash())
	// The extension is sent and held at the gate, then its caller gives up
	// (forced order; a 100 ms ctx could end before the request was sent).
	ectx, cancel := context.WithCancel(ctx)
	extDone := make(chan error, 1)
	go func() { extDone <- a.Extend(ectx, 300*time.Millisecond) }()
	require.NoError(t, gate.WaitHeld(1, script.Extend.Hash(), 5*time.Second), "the extension is held at the gate")
	cancel()
	extErr := redistest.Await(t, probe, extDone, 5*time.Second, 3, "Extend did not return at its ctx's end")
	require.Error(t, extErr)
	require.NotErrorIs(t, extErr, redlease.ErrNotHeld, "undecided, not refused")
	require.False(t, a.Until().After(time.Now().Add(300*time.Millisecond)),
		"Until %v from now: past the undecided extension's start plus its 300 ms", time.Until(a.Until()))
	require.NoError(t, gate.Step("", 5*time.Second)) // the extension lands after all
	gate.Open()
	at, ok, err := redistest.Expiry(ctx, srv.Client(), key)
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, at.Add(redistest.Precision).Before(asked.Add(20*time.Second)),
		"the late shorter extension left the key's longer life: it expires %v after the acquisition's start, not 20 s", at.Sub(asked))
	redistest.Await(t, probe, lost, 5*time.Second, 3, "Lost not closed after the 300 ms extension was sent")
	require.False(t, a.Valid())
	_, err = lb.TryLock(ctx, key)
	require.ErrorIs(t, err, redlease.ErrNotObtained, "the key keeps its longer life: B waits for it, or for A's release")
	require.NoError(t, a.Release(ctx), "A's token still holds the key: the release deletes it")
	b, err := lb.TryLock(ctx, key)
	require.NoError(t, err, "released: B may take it")
	require.NoError(t, b.Release(ctx))
}

// Found by the simulator (TestFindingExtendAfterUndecided, seed 2586 of
// quorum3-extend): an Extend to a short TTL whose answer never came, then
// an Extend to a long TTL that succeeded. The short one may land after the
// long one; a node that reset the TTL would expire the key early, so the
// lock counts on no more than the long one's start plus the short TTL.
// The nodes never shorten a held key: the key keeps the long extension's
// life, which outlives that Until. Forced order: the short extension is
// held in the gate, the long one goes through, then the short one lands;
// B is refused until A releases.
func TestSuccessfulExtendAfterAnUndecidedShorterOne(t *testing.T) {
	ctx := t.Context()
	srv, gate, c := gatedServer(t)
	strategy, err := single.New(c)
	require.NoError(t, err)
	la, err := redlease.New(strategy, redlease.WithTTL(3*time.Second))
	require.NoError(t, err) // loss margin 300 ms
	lb := singleLocker(t, srv.Client(), redlease.WithTTL(20*time.Second))
	const key = "attack:extendafter"
	a, err := la.TryLock(ctx, key)
	require.NoError(t, err)

	gate.HoldRequests("$4\r\n1333\r\n") // the 1333 ms extension's TTL argument, and nothing else
	ectx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	shortErr := a.Extend(ectx, 1333*time.Millisecond)
	cancel()
	require.Error(t, shortErr)
	require.NotErrorIs(t, shortErr, redlease.ErrNotHeld, "undecided, not refused")
	longAsked := time.Now()
	require.NoError(t, a.Extend(ctx, 10*time.Second), "the long extension goes through")
	require.False(t, a.Until().After(time.Now().Add(1333*time.Millisecond)),
		"Until %v from now: past the long extension's start plus the undecided 1333 ms", time.Until(a.Until()))
	require.NoError(t, gate.Step("", 5*time.Second)) // the short one lands last
	gate.Open()
	until := a.Until()
	at, ok, err := redistest.Expiry(ctx, srv.Client(), key)
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, at.Add(redistest.Precision).Before(longAsked.Add(10*time.Second)),
		"the late short extension left the long one's life: the key expires %v after the long extension's start, not 10 s", at.Sub(longAsked))
	require.False(t, at.Add(redistest.Precision).Before(until), "the key outlives A's Until (expires %v before it)", until.Sub(at))
	_, err = lb.TryLock(ctx, key)
	require.ErrorIs(t, err, redlease.ErrNotObtained, "the key keeps the long extension's life: B waits for it, or for A's release")
	require.NoError(t, a.Release(ctx))
	b, err := lb.TryLock(ctx, key)
	require.NoError(t, err, "released: B may take it")
	require.NoError(t, b.Release(ctx))
}

// gatedServer starts a server with the scripts loaded, a gate in front of
// it, and a client (ContextTimeoutEnabled) that reaches it through the gate.
func gatedServer(t *testing.T) (*redistest.Server, *redistest.Gate, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t, redistest.Config{})
	loadScripts(t, srv.Client())
	gate := redistest.NewGate(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: gate.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return srv, gate, c
}
