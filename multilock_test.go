package redlease_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/contract"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/renew"
)

// TestOppositeTransfersOnSingle and TestOppositeTransfersOnQuorum: 10,000
// transfers between the same two accounts, half in each direction, by 16
// goroutines, each under DoAll of both accounts: none deadlocks (each
// DoAll has 30 s), none overlaps another on an account, every one is
// applied once.
func TestOppositeTransfersOnSingle(t *testing.T) {
	t.Parallel()
	oppositeTransfers(t, singleNode(t))
}

func TestOppositeTransfersOnQuorum(t *testing.T) {
	t.Parallel()
	servers := redistest.StartN(t, 3, redistest.Config{})
	oppositeTransfers(t, quorumOver(t, directClients(t, servers)))
}

func oppositeTransfers(t *testing.T, s redlease.Strategy) {
	const workers, each = 16, 625
	l := newLocker(t, s, redlease.WithTTL(5*time.Second), redlease.WithKeeper(watchdog(t)))
	overlaps, applied, err := contract.Transfers(t.Context(), l, []string{"acct:1", "acct:2"}, workers, each)
	require.NoError(t, err)
	assert.Zero(t, overlaps, "transfers inside an account at once")
	assert.EqualValues(t, workers*each, applied)
}

// TestLockAllKeepsTheKeysTakenFirstWhileItWaits: while LockAll waits for
// its second key, its Keeper renews the first, so a wait longer than the
// TTL still ends with the whole set held.
func TestLockAllKeepsTheKeysTakenFirstWhileItWaits(t *testing.T) {
	c := redistest.Start(t, redistest.Config{}).Client()
	const ttl = 300 * time.Millisecond
	l := singleLocker(t, c, redlease.WithTTL(ttl), redlease.WithKeeper(watchdog(t)))
	set, err := waitPastFirstKeysTTL(t, c, l, ttl)
	require.NoError(t, err)
	assert.True(t, set.Valid(), "the set is held as a whole")
	require.NoError(t, set.Release(t.Context()))
}

// TestLockAllReturnsTheLossOfAKeyTakenFirst: without a Keeper, the first
// key expires while LockAll waits for the second; LockAll then returns
// that loss and releases the second, rather than a set not held.
func TestLockAllReturnsTheLossOfAKeyTakenFirst(t *testing.T) {
	c := redistest.Start(t, redistest.Config{}).Client()
	const ttl = 300 * time.Millisecond
	l := singleLocker(t, c, redlease.WithTTL(ttl), redlease.WithoutKeeper())
	set, err := waitPastFirstKeysTTL(t, c, l, ttl)
	require.ErrorIs(t, err, redlease.ErrLost)
	assert.Nil(t, set)
	assert.Contains(t, err.Error(), `"set:a"`)
	n, err := c.Exists(t.Context(), "set:a", "set:b").Result()
	require.NoError(t, err)
	assert.Zero(t, n, "neither key is left held")
}

// waitPastFirstKeysTTL holds set:b elsewhere, starts LockAll(set:b,
// set:a), which takes set:a and waits for set:b, and releases set:b only
// once set:a's first TTL has passed since before LockAll began (set:a
// would have expired without a renewal); it returns LockAll's result.
func waitPastFirstKeysTTL(t *testing.T, c *redis.Client, l *redlease.Locker, ttl time.Duration) (*redlease.LockSet, error) {
	t.Helper()
	other := singleLocker(t, c, redlease.WithTTL(time.Minute))
	held, err := other.TryLock(t.Context(), "set:b")
	require.NoError(t, err)
	type result struct {
		set *redlease.LockSet
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		set, err := l.LockAll(t.Context(), []string{"set:b", "set:a"})
		done <- result{set, err}
	}()
	// set:a is taken first (it sorts first).
	require.Eventually(t, func() bool { return c.Exists(t.Context(), "set:a").Val() == 1 }, 10*time.Second, time.Millisecond)
	for time.Since(start) < ttl+ttl/2 {
		time.Sleep(10 * time.Millisecond)
	}
	require.NoError(t, held.Release(t.Context()))
	select {
	case r := <-done:
		return r.set, r.err
	case <-time.After(30 * time.Second):
		t.Fatal("LockAll did not return within 30 s of the release")
		return nil, nil
	}
}

// TestDoAllCancelsFnWhenAKeyIsLost: one key of the set taken from under
// it (deleted on the node); the next renewal finds it not held, fn's ctx
// ends with the loss, and DoAll returns it.
func TestDoAllCancelsFnWhenAKeyIsLost(t *testing.T) {
	c := redistest.Start(t, redistest.Config{}).Client()
	l := singleLocker(t, c, redlease.WithTTL(300*time.Millisecond), redlease.WithKeeper(watchdog(t)))
	err := l.DoAll(t.Context(), []string{"do:a", "do:b"}, func(ctx context.Context, set *redlease.LockSet) error {
		require.NoError(t, c.Del(context.Background(), "do:b").Err())
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(30 * time.Second):
			return errors.New("fn's ctx was not cancelled within 30 s")
		}
	})
	require.ErrorIs(t, err, redlease.ErrLost)
	require.ErrorIs(t, err, redlease.ErrNotHeld)
	assert.Zero(t, c.Exists(t.Context(), "do:a").Val(), "the other key released")
}

// TestLockAllRejectsBadInput: no keys, an empty key, a key twice, a nil
// fn: ErrInvalid, and nothing taken.
func TestLockAllRejectsBadInput(t *testing.T) {
	_, l, _ := fakeLock(t)
	ctx := t.Context()
	for name, keys := range map[string][]string{"none": nil, "empty key": {"x", ""}, "twice": {"x", "y", "x"}} {
		_, err := l.LockAll(ctx, keys)
		assert.ErrorIs(t, err, redlease.ErrInvalid, name)
		_, err = l.TryLockAll(ctx, keys)
		assert.ErrorIs(t, err, redlease.ErrInvalid, name)
	}
	assert.ErrorIs(t, l.DoAll(ctx, []string{"x"}, nil), redlease.ErrInvalid)
	set, err := l.TryLockAll(ctx, []string{"x", "y"})
	require.NoError(t, err, "nothing was taken by the calls refused")
	require.NoError(t, set.Release(ctx))
}

// watchdog is a renew.Watchdog closed when t ends.
func watchdog(t *testing.T) *renew.Watchdog {
	t.Helper()
	w, err := renew.New()
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	return w
}

// opNames records the name (and keys) of every operation an Observer is
// told of.
type opNames struct {
	mu  sync.Mutex
	ops []string
}

func (o *opNames) Start(ctx context.Context, op redlease.Op) (context.Context, func(error)) {
	o.mu.Lock()
	o.ops = append(o.ops, op.Name+" "+op.Key)
	o.mu.Unlock()
	return ctx, func(error) {}
}
func (o *opNames) Held(redlease.Op, time.Duration, error)                       {}
func (o *opNames) NodeFailed(context.Context, redlease.Op, *redlease.NodeError) {}

func (o *opNames) names() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.ops)
}

// TestTryLockAllTakesASetTogetherInOneStep: on one primary, a set is
// taken by one atomic step (one "acquire_set", no single "acquire"),
// each key under the attempt's token with a fence of its own counter,
// and released as a set.
func TestTryLockAllTakesASetTogetherInOneStep(t *testing.T) {
	c := redistest.Start(t, redistest.Config{}).Client()
	ctx := t.Context()
	require.NoError(t, c.Set(ctx, script.MustFenceKey("one:b"), 41, time.Hour).Err())
	o := &opNames{}
	l := singleLocker(t, c, redlease.WithObserver(o))
	set, err := l.TryLockAll(ctx, []string{"one:b", "one:a"})
	require.NoError(t, err)
	assert.Equal(t, []string{"acquire_set one:a,one:b"}, o.names())
	assert.Equal(t, []string{"one:a", "one:b"}, set.Keys())
	assert.EqualValues(t, 42, set.Fence("one:b"), "b's own counter, incremented")
	assert.Greater(t, set.Fence("one:a"), uint64(1e15), "a's counter, created from the server's clock")
	for _, lk := range set.Locks() {
		assert.Equal(t, lk.Token(), c.Get(ctx, lk.Key()).Val(), "%s held under its lock's token", lk.Key())
	}
	require.NoError(t, set.Release(ctx))
	assert.Zero(t, c.Exists(ctx, "one:a", "one:b").Val(), "both released")
}

// TestTryLockAllRefusedWritesNothing: a set whose second key another
// holds is refused at that key, and its first key was never written:
// its fence counter was not even created (taken one by one, the first
// key would have been granted, fenced and released again).
func TestTryLockAllRefusedWritesNothing(t *testing.T) {
	c := redistest.Start(t, redistest.Config{}).Client()
	ctx := t.Context()
	other := singleLocker(t, c, redlease.WithTTL(time.Minute))
	_, err := other.TryLock(ctx, "none:b")
	require.NoError(t, err)
	l := singleLocker(t, c)
	set, err := l.TryLockAll(ctx, []string{"none:a", "none:b"})
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.Nil(t, set)
	assert.Contains(t, err.Error(), `"none:b"`)
	assert.Zero(t, c.Exists(ctx, "none:a", script.MustFenceKey("none:a")).Val(), "none:a and its counter never written")
}

// TestLockAllWithOneAttemptIsOneStep: WithMaxAttempts(1) makes LockAll's
// first attempt its only one: the set's one step, refused as a whole.
func TestLockAllWithOneAttemptIsOneStep(t *testing.T) {
	c := redistest.Start(t, redistest.Config{}).Client()
	ctx := t.Context()
	other := singleLocker(t, c, redlease.WithTTL(time.Minute))
	_, err := other.TryLock(ctx, "max:b")
	require.NoError(t, err)
	o := &opNames{}
	l := singleLocker(t, c, redlease.WithObserver(o), redlease.WithPolling())
	_, err = l.LockAll(ctx, []string{"max:a", "max:b"}, redlease.WithMaxAttempts(1))
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.Equal(t, []string{"acquire_set max:a,max:b"}, o.names())
}

// TestLockAllFairTakesTheKeysInOrder: a fair LockAll takes each key
// through its own line (one "wait" per key), never in one step that
// would pass the lines by.
func TestLockAllFairTakesTheKeysInOrder(t *testing.T) {
	c := redistest.Start(t, redistest.Config{}).Client()
	o := &opNames{}
	l := singleLocker(t, c, redlease.WithObserver(o))
	set, err := l.LockAll(t.Context(), []string{"fair:b", "fair:a"}, redlease.WithFairness(true))
	require.NoError(t, err)
	assert.Equal(t, []string{"wait fair:a", "acquire fair:a", "wait fair:b", "acquire fair:b"}, o.names())
	require.NoError(t, set.Release(t.Context()))
}

// bornLostSets is the fake as a SetAcquirer whose steps grant every key
// (as its Acquire would) but come back with only left of validity: a
// reply slowed past the loss margin.
type bornLostSets struct {
	*fake
	left time.Duration
}

func (b bornLostSets) Together([]string) bool { return true }

func (b bornLostSets) AcquireSet(ctx context.Context, keys []string, token string, ttl time.Duration) ([]redlease.Grant, int, error) {
	grants := make([]redlease.Grant, len(keys))
	for i, k := range keys {
		g, err := b.Acquire(ctx, k, token, ttl)
		if err != nil {
			return nil, i, err
		}
		grants[i] = redlease.Grant{Until: time.Now().Add(b.left), Fence: g.Fence}
	}
	return grants, -1, nil
}

// TestTryLockAllRefusesASetBornLost: a step that came back with less
// validity than the loss margin is not handed out (work started under it
// could outlive it): TryLockAll answers not obtained, and every key of
// the step is released by its token.
func TestTryLockAllRefusesASetBornLost(t *testing.T) {
	f := newFake()
	const ttl = time.Second // loss margin: a tenth, 100 ms
	l := newLocker(t, bornLostSets{f, 50 * time.Millisecond}, redlease.WithTTL(ttl))
	set, err := l.TryLockAll(t.Context(), []string{"b", "a"})
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.Nil(t, set)
	f.mu.Lock()
	defer f.mu.Unlock()
	assert.Equal(t, []string{"a", "b"}, f.keys, "one step, in the set's order")
	assert.Empty(t, f.held, "both keys released")
	assert.Equal(t, 2, f.releases)
}
