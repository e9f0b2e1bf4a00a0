package redlease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// operatorSetups are the strategies an operator's calls are shown on, on
// real redis-server processes: one primary, and a quorum of three.
func operatorSetups() map[string]func(t *testing.T) (redlease.Strategy, []redis.UniversalClient) {
	return map[string]func(t *testing.T) (redlease.Strategy, []redis.UniversalClient){
		"single": func(t *testing.T) (redlease.Strategy, []redis.UniversalClient) {
			c := redistest.Start(t, redistest.Config{}).Client()
			s, err := single.New(c)
			require.NoError(t, err)
			return s, []redis.UniversalClient{c}
		},
		"quorum": func(t *testing.T) (redlease.Strategy, []redis.UniversalClient) {
			cs := directClients(t, redistest.StartN(t, 3, redistest.Config{}))
			return quorumOver(t, cs), cs
		},
	}
}

// Must-show 4: a holder kept alive by Do's default watchdog is inspected,
// then forced out by an operator's ForceRelease of the token Inspect
// showed; the holder's Lost closes at its next renewal, which finds the
// key gone (ErrNotHeld, not an expiry), within one renewal interval and
// one call bound of the force; fn's ctx ends with it and Do reports the
// loss; a waiter takes the key at once with a higher fence.
func TestForceReleaseEndsTheHolderAtItsNextRenewal(t *testing.T) {
	for name, setup := range operatorSetups() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, _ := setup(t)
			const ttl = 3 * time.Second // renewed every second: expiry is far from the window below
			l := newLocker(t, s, redlease.WithPrefix("ops:"), redlease.WithTTL(ttl))
			ctx, key := t.Context(), "settle:"+t.Name()

			held := make(chan *redlease.Lock, 1)
			fnDone := make(chan error, 1)
			doDone := make(chan error, 1)
			go func() {
				doDone <- l.Do(ctx, key, func(ctx context.Context, lk *redlease.Lock) error {
					held <- lk
					select {
					case <-ctx.Done():
						fnDone <- context.Cause(ctx)
					case <-time.After(time.Minute):
						fnDone <- errors.New("fn's ctx never ended")
					}
					return nil
				})
			}()
			probe := redistest.StartStallProbe(t)
			lk := redistest.Await(t, probe, held, 10*time.Second, 3, "Do's grant")

			in, err := l.Inspect(ctx, key)
			require.NoError(t, err)
			assert.Equal(t, redlease.KeyHeld, in.State)
			assert.Equal(t, key, in.Key, "without the prefix")
			assert.Equal(t, lk.Token(), in.Token)
			assert.GreaterOrEqual(t, in.Fence, lk.Fence())
			assert.Positive(t, in.Remaining)
			assert.LessOrEqual(t, in.Remaining, ttl)
			assert.True(t, in.Since.IsZero(), "a library holder records no grant time")

			waiter := lockAsync(ctx, newLocker(t, s, redlease.WithPrefix("ops:")), key)

			forced := time.Now()
			r, err := l.ForceRelease(ctx, key, in.Token)
			require.NoError(t, err)
			assert.GreaterOrEqual(t, r.Deleted, r.Quorum)
			assert.Equal(t, key, r.Key)

			// The next renewal comes within one renewal interval (a third of
			// the TTL) and takes at most the strategy's call bound.
			bound := ttl/3 + callBound(s)
			redistest.Await(t, probe, lk.Lost(), bound, 3, "the forced holder's Lost")
			took := time.Since(forced)
			require.ErrorIs(t, lk.Err(), redlease.ErrLost)
			require.ErrorIs(t, lk.Err(), redlease.ErrNotHeld, "a renewal found the key gone: %v", lk.Err())
			t.Logf("Lost closed %v after the forced release (bound %v): %v", took.Round(time.Millisecond), bound, lk.Err())

			assert.ErrorIs(t, redistest.Await(t, probe, fnDone, bound, 3, "fn's ctx"), redlease.ErrLost)
			assert.ErrorIs(t, redistest.Await(t, probe, doDone, bound, 3, "Do's return"), redlease.ErrLost)

			w := redistest.Await(t, probe, waiter, 10*time.Second, 3, "the waiter")
			require.NoError(t, w.err)
			defer w.lk.Release(context.Background())
			assert.Greater(t, w.lk.Fence(), lk.Fence(), "the revoked holder's fence is stale")
		})
	}
}

// callBound is s's call bound (redlease.CallBounder), DefaultCallBound
// where it states none.
func callBound(s redlease.Strategy) time.Duration {
	if b, ok := s.(redlease.CallBounder); ok {
		return b.CallBound()
	}
	return redlease.DefaultCallBound
}

// The attack on an operator's force: the key changes hands between the
// Inspect the operator read and the ForceRelease it sends. The force
// compares the token it was given, deletes nothing, says ErrNotHeld, and
// the new holder keeps its lock and renews it.
func TestForceReleaseAfterTheKeyChangedHands(t *testing.T) {
	for name, setup := range operatorSetups() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			s, cs := setup(t)
			l := newLocker(t, s, redlease.WithPrefix("ops:"))
			ctx, key := t.Context(), "pay:"+t.Name()
			first, err := l.TryLock(ctx, key)
			require.NoError(t, err)
			seen, err := l.Inspect(ctx, key)
			require.NoError(t, err)
			require.Equal(t, first.Token(), seen.Token)

			require.NoError(t, first.Release(ctx))
			next, err := l.TryLock(ctx, key)
			require.NoError(t, err)
			defer next.Release(context.Background())

			// A quorum's release returns at a majority: a node it did not
			// reach yet (or whose request it never sent, the round being
			// decided) may still hold the old token, and the force then
			// deletes that leftover, and nothing else. It failed once so
			// (make test, s52): nil, where ErrNotHeld was expected.
			stale := map[int]bool{}
			for i, c := range cs {
				if v, _ := c.Get(ctx, "ops:"+key).Result(); v == seen.Token {
					stale[i] = true
				}
			}
			r, err := l.ForceRelease(ctx, key, seen.Token)
			if len(stale) == 0 {
				require.ErrorIs(t, err, redlease.ErrNotHeld)
			}
			assert.LessOrEqual(t, r.Deleted, len(stale), "only leftovers of the old token are deleted")
			for i, n := range r.Nodes {
				assert.False(t, n.Deleted && !stale[i], "node %d deleted a key it held for another token", i)
				assert.NoError(t, n.Err)
			}
			if len(stale) > 0 {
				t.Logf("%d node(s) still held the old token at the force: deleted %d", len(stale), r.Deleted)
			}
			held := 0
			for _, c := range cs {
				if v, _ := c.Get(ctx, "ops:"+key).Result(); v == next.Token() {
					held++
				}
			}
			assert.GreaterOrEqual(t, held, r.Quorum, "the new holder's key is left alone")
			require.NoError(t, next.Extend(ctx, 5*time.Second), "the new holder renews")
			assert.True(t, next.Valid())
		})
	}
}

// Inspect and ForceRelease apply the Locker's prefix and refuse bad
// input with ErrInvalid, never a panic; a strategy without the powers is
// refused the same way.
func TestOperatorCallsRejectBadInput(t *testing.T) {
	t.Parallel()
	l := newLocker(t, singleNode(t), redlease.WithPrefix("ops:"))
	ctx := t.Context()
	for _, key := range []string{"", "a}b"} {
		_, err := l.Inspect(ctx, key)
		assert.ErrorIs(t, err, redlease.ErrInvalid, "Inspect(%q)", key)
		_, err = l.ForceRelease(ctx, key, "tok")
		assert.ErrorIs(t, err, redlease.ErrInvalid, "ForceRelease(%q)", key)
	}
	_, err := l.ForceRelease(ctx, "k", "")
	assert.ErrorIs(t, err, redlease.ErrInvalid, "an empty token")
	var nilLocker *redlease.Locker
	_, err = nilLocker.Inspect(ctx, "k")
	assert.ErrorIs(t, err, redlease.ErrInvalid)
	_, err = nilLocker.ForceRelease(ctx, "k", "tok")
	assert.ErrorIs(t, err, redlease.ErrInvalid)

	plainLocker := newLocker(t, plain{}) // a Strategy with neither power
	_, err = plainLocker.Inspect(ctx, "k")
	assert.ErrorIs(t, err, redlease.ErrInvalid)
	_, err = plainLocker.ForceRelease(ctx, "k", "tok")
	assert.ErrorIs(t, err, redlease.ErrInvalid)

	prefixed := newLocker(t, singleNode(t), redlease.WithPrefix(redlease.ReservedPrefix))
	_, err = prefixed.Inspect(ctx, "fence:{x}")
	assert.ErrorIs(t, err, redlease.ErrInvalid, "a prefix into the reserved namespace")
}

// Inspect and ForceRelease return within the strategy's call bound with
// go-redis's default client options (no ContextTimeoutEnabled: a call to a
// paused server would otherwise wait for the 3 s read timeout and the
// retries), on a ctx without a deadline.
func TestOperatorCallsBoundedOnAPausedNode(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr}) // go-redis defaults
	t.Cleanup(func() { _ = c.Close() })
	s, err := single.New(c)
	require.NoError(t, err)
	l := newLocker(t, s)
	ctx := context.Background()
	// Retried: the first call (a dial, NOSCRIPT, then EVAL) missed the 1 s
	// call bound once at load 9 with -race.
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lk, err := l.Lock(lctx, "paused")
	require.NoError(t, err)
	// Both scripts cached, so that the calls below are one round trip.
	require.NoError(t, script.Inspect.Load(ctx, c))

	srv.Pause()
	defer srv.Resume()
	probe := redistest.StartStallProbe(t)
	for _, call := range []struct {
		name string
		do   func() error
	}{
		{"Inspect", func() error { _, err := l.Inspect(ctx, "paused"); return err }},
		{"ForceRelease", func() error { _, err := l.ForceRelease(ctx, "paused", lk.Token()); return err }},
	} {
		start := time.Now()
		err := call.do()
		took := time.Since(start)
		assert.ErrorIs(t, err, redlease.ErrUnavailable, call.name)
		assert.ErrorIs(t, err, context.DeadlineExceeded, call.name)
		ok, why := probe.Within(took, redlease.DefaultCallBound, 3, start)
		assert.True(t, ok, "%s: %s", call.name, why)
		assert.GreaterOrEqual(t, took, redlease.DefaultCallBound-redlease.DefaultCallBound/32, "%s waited for the bound", call.name)
	}
}

// On a quorum with go-redis's default client options, a paused node costs
// Inspect and ForceRelease one node timeout, not the client's read
// timeout: the others decide, and the paused node is reported.
func TestOperatorCallsBoundedOnAPausedQuorumNode(t *testing.T) {
	t.Parallel()
	servers := redistest.StartN(t, 3, redistest.Config{})
	var cs []redis.UniversalClient
	for _, s := range servers {
		c := redis.NewClient(&redis.Options{Addr: s.Addr}) // go-redis defaults
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	// A second, not go-redis's 3 s read timeout and retries; long enough
	// that the live nodes answer within it on a loaded machine.
	const nodeTimeout = time.Second
	l := newLocker(t, quorumOver(t, cs, quorum.WithNodeTimeout(nodeTimeout)))
	ctx := context.Background()
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lk, err := l.Lock(lctx, "paused")
	require.NoError(t, err)
	probe := redistest.StartStallProbe(t)
	// The grant returns at a majority: wait for the third node's copy (and
	// every node knows the inspect script from then on).
	probe.WaitFor(t, 5*time.Second, 3, 10*time.Millisecond, func() bool {
		in, err := l.Inspect(ctx, "paused")
		return err == nil && in.Holding == 3
	}, "every node holds the key")

	servers[2].Pause()
	defer servers[2].Resume()
	start := time.Now()
	in, err := l.Inspect(ctx, "paused")
	took := time.Since(start)
	require.NoError(t, err)
	assert.Equal(t, redlease.KeyHeld, in.State)
	assert.Equal(t, 2, in.Holding)
	assert.ErrorIs(t, in.Nodes[2].Err, context.DeadlineExceeded)
	ok, why := probe.Within(took, nodeTimeout, 3, start)
	assert.True(t, ok, "Inspect: %s", why)

	start = time.Now()
	r, err := l.ForceRelease(ctx, "paused", lk.Token())
	took = time.Since(start)
	require.NoError(t, err, "deleted on the two that answer: a majority")
	assert.Equal(t, 2, r.Deleted)
	assert.ErrorIs(t, r.Nodes[2].Err, context.DeadlineExceeded)
	ok, why = probe.Within(took, nodeTimeout, 3, start)
	assert.True(t, ok, "ForceRelease: %s", why)
}

// recorder is an Observer that records the operations it is told of, and
// the nodes that failed in them.
type recorder struct {
	mu     sync.Mutex
	ops    []string // "name key outcome"
	failed []string // "name node"
}

func (r *recorder) Start(ctx context.Context, op redlease.Op) (context.Context, func(error)) {
	return ctx, func(err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		outcome := "ok"
		if err != nil {
			outcome = err.Error()
		}
		r.ops = append(r.ops, op.Name+" "+op.Key+" "+outcome)
	}
}
func (r *recorder) Held(redlease.Op, time.Duration, error) {}
func (r *recorder) NodeFailed(_ context.Context, op redlease.Op, ne *redlease.NodeError) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = append(r.failed, fmt.Sprintf("%s %d", op.Name, ne.Node))
}

// An operator's calls reach the Locker's Observer: "inspect" and
// "force_release", with the key as given and each node that failed.
func TestOperatorCallsAreObserved(t *testing.T) {
	t.Parallel()
	servers := redistest.StartN(t, 3, redistest.Config{})
	rec := &recorder{}
	l := newLocker(t, quorumOver(t, directClients(t, servers)), redlease.WithPrefix("ops:"), redlease.WithObserver(rec))
	ctx := t.Context()
	lk, err := l.TryLock(ctx, "audit")
	require.NoError(t, err)
	// The grant returns at a majority: node 2's request must have landed
	// before the kill, or its failure would be the acquisition's.
	probe, c2 := redistest.StartStallProbe(t), servers[2].Client()
	probe.WaitFor(t, 5*time.Second, 3, 5*time.Millisecond, func() bool {
		v, _ := c2.Get(ctx, "ops:audit").Result()
		return v == lk.Token()
	}, "node 2 holds the key")
	servers[2].Kill()
	_, err = l.Inspect(ctx, "audit")
	require.NoError(t, err)
	_, err = l.ForceRelease(ctx, "audit", lk.Token())
	require.NoError(t, err)

	rec.mu.Lock()
	defer rec.mu.Unlock()
	assert.Equal(t, []string{"acquire audit ok", "inspect audit ok", "force_release audit ok"}, rec.ops)
	assert.Equal(t, []string{"inspect 2", "force_release 2"}, rec.failed)
}

// The case TestForceReleaseAfterTheKeyChangedHands met once: a quorum's
// release returned at a majority and one node still held the old token
// when the new holder took the key on the others. Forced here: the old
// token is put back on one node (one the new grant did not reach, if
// any; else the new holder's copy there is overwritten). The force of
// the old token deletes that leftover and nothing else; the new holder
// keeps its majority and renews.
func TestForceReleaseDeletesOnlyALeftoverOfTheOldToken(t *testing.T) {
	t.Parallel()
	s, cs := operatorSetups()["quorum"](t)
	l := newLocker(t, s, redlease.WithPrefix("ops:"))
	ctx, key := t.Context(), "pay:leftover"
	// The old holder's token, made up: a real one's release may still
	// be on its way to a node, and would delete the leftover first.
	old := "0ldHolderToken0ldHolder.1"
	next, err := l.TryLock(ctx, key)
	require.NoError(t, err)
	defer next.Release(context.Background())
	// The leftover goes on a node the new grant did not reach (its
	// round returned at a majority), or else on the last node.
	left := len(cs) - 1
	for i, c := range cs {
		if v, _ := c.Get(ctx, "ops:"+key).Result(); v != next.Token() {
			left = i
			break
		}
	}
	require.NoError(t, cs[left].Set(ctx, "ops:"+key, old, time.Minute).Err())

	r, err := l.ForceRelease(ctx, key, old)
	require.NoError(t, err, "the old token was deleted where it was left")
	assert.Equal(t, 1, r.Deleted)
	held := 0
	for i, n := range r.Nodes {
		assert.Equal(t, i == left, n.Deleted, "node %d", i)
		if v, _ := cs[i].Get(ctx, "ops:"+key).Result(); v == next.Token() {
			held++
		}
	}
	assert.GreaterOrEqual(t, held, r.Quorum, "the new holder's key is left alone")
	require.NoError(t, next.Extend(ctx, 5*time.Second), "the new holder renews on its majority")
}
