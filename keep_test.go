package redlease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
)

// batchFake is a fake that extends in batches and counts the calls.
type batchFake struct {
	*fake
	mu      sync.Mutex
	batches int
}

func (b *batchFake) ExtendBatch(ctx context.Context, items []redlease.Extension) []redlease.Extended {
	b.mu.Lock()
	b.batches++
	b.mu.Unlock()
	out := make([]redlease.Extended, len(items))
	for i, it := range items {
		g, err := b.Extend(ctx, it.Key, it.Token, it.TTL)
		out[i] = redlease.Extended{Grant: g, Err: err}
	}
	return out
}

// keeper records what Do asks of it.
type keeper struct {
	mu      sync.Mutex
	kept    []*redlease.Lock
	stopped int
}

func (k *keeper) Keep(lk *redlease.Lock) func() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.kept = append(k.kept, lk)
	return func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		k.stopped++
	}
}

func TestDoHoldsWhileFnRunsAndReleasesAfter(t *testing.T) {
	f := newFake()
	k := &keeper{}
	l, err := redlease.New(f, redlease.WithKeeper(k))
	require.NoError(t, err)
	var fence uint64
	err = l.Do(t.Context(), "job", func(ctx context.Context, lk *redlease.Lock) error {
		fence = lk.Fence()
		assert.True(t, lk.Valid())
		_, err := l.TryLock(ctx, "job")
		assert.ErrorIs(t, err, redlease.ErrNotObtained, "the key is held while fn runs")
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, uint64(1), fence)
	assert.Empty(t, f.held, "released after fn")
	assert.Len(t, k.kept, 1)
	assert.Equal(t, 1, k.stopped, "renewal stopped")
}

func TestDoReturnsFnErrorAndStillReleases(t *testing.T) {
	f := newFake()
	boom := errors.New("boom")
	locker, err := redlease.New(f)
	require.NoError(t, err)
	err = locker.Do(t.Context(), "job", func(context.Context, *redlease.Lock) error { return boom })
	assert.ErrorIs(t, err, boom)
	assert.NotErrorIs(t, err, redlease.ErrLost)
	assert.Empty(t, f.held)
}

func TestDoReportsLossEvenWhenFnSucceeds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		var cause error
		locker, err := redlease.New(f, redlease.WithTTL(time.Second), redlease.WithoutKeeper())
		require.NoError(t, err)
		err = locker.Do(t.Context(), "job",
			func(ctx context.Context, lk *redlease.Lock) error {
				<-ctx.Done() // no keeper: the lock runs out, and fn hears of it
				cause = context.Cause(ctx)
				assert.True(t, time.Now().Before(lk.Until()), "fn is told before Until")
				return nil
			})
		assert.ErrorIs(t, err, redlease.ErrLost)
		assert.ErrorIs(t, cause, redlease.ErrLost)
	})
}

func TestDoReleasesOnPanic(t *testing.T) {
	f := newFake()
	assert.Panics(t, func() {
		locker, err := redlease.New(f)
		require.NoError(t, err)
		_ = locker.Do(t.Context(), "job", func(context.Context, *redlease.Lock) error { panic("boom") })
	})
	assert.Empty(t, f.held)
}

func TestDoDoesNotRunFnWithoutTheLock(t *testing.T) {
	f := newFake()
	l, err := redlease.New(f)
	require.NoError(t, err)
	lk, err := l.TryLock(t.Context(), "job")
	require.NoError(t, err)
	defer lk.Release(t.Context())
	ran := false
	err = l.Do(t.Context(), "job", func(context.Context, *redlease.Lock) error { ran = true; return nil },
		redlease.WithMaxAttempts(2), redlease.WithRetryDelay(time.Millisecond, time.Millisecond))
	assert.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.False(t, ran)
	assert.ErrorIs(t, l.Do(t.Context(), "job", nil), redlease.ErrInvalid)
}

func TestExtendAllBatchesPerStrategy(t *testing.T) {
	batch := &batchFake{fake: newFake()}
	plain := newFake()
	ctx := t.Context()
	var locks []*redlease.Lock
	for _, key := range []string{"a", "b", "c"} {
		locker, err := redlease.New(batch, redlease.WithTTL(time.Minute))
		require.NoError(t, err)
		lk, err := locker.TryLock(ctx, key)
		require.NoError(t, err)
		locks = append(locks, lk)
	}
	locker2, err := redlease.New(plain, redlease.WithTTL(time.Minute))
	require.NoError(t, err)
	lk, err := locker2.TryLock(ctx, "d")
	require.NoError(t, err)
	locks = append(locks, lk)
	before := locks[0].Until()

	delete(batch.held, "b") // b was taken from us behind our back
	time.Sleep(time.Millisecond)
	errs := redlease.ExtendAll(ctx, locks)

	assert.Equal(t, 1, batch.batches, "one batch call for the three locks of one strategy")
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], redlease.ErrNotHeld)
	assert.NoError(t, errs[2])
	assert.NoError(t, errs[3])
	assert.True(t, locks[0].Until().After(before), "Until moves")
	assert.ErrorIs(t, locks[1].Err(), redlease.ErrLost, "a lock found not held is marked lost")

	require.NoError(t, locks[0].Release(ctx))
	errs = redlease.ExtendAll(ctx, locks[:1])
	assert.ErrorIs(t, errs[0], redlease.ErrNotHeld, "a released lock is not extended")
}

// revokerFake tracks grants the way the failover strategy does.
type revokerFake struct {
	*fake
	mu      sync.Mutex
	revokes map[string]func(error)
}

func (r *revokerFake) Track(key, token string, revoke func(error)) func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.revokes[token] = revoke
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.revokes, token)
	}
}

func (r *revokerFake) revokeAll(cause error) {
	r.mu.Lock()
	var fns []func(error)
	for _, f := range r.revokes {
		fns = append(fns, f)
	}
	r.mu.Unlock()
	for _, f := range fns {
		f(cause)
	}
}

func (r *revokerFake) tracked() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.revokes)
}

func TestRevokedGrantsAreLostAtOnce(t *testing.T) {
	r := &revokerFake{fake: newFake(), revokes: map[string]func(error){}}
	l, err := redlease.New(r)
	require.NoError(t, err)
	ctx := t.Context()
	a, err := l.TryLock(ctx, "a")
	require.NoError(t, err)
	b, err := l.TryLock(ctx, "b")
	require.NoError(t, err)
	assert.Equal(t, 2, r.tracked())

	require.NoError(t, b.Release(ctx))
	assert.Equal(t, 1, r.tracked(), "release untracks")

	failover := errors.New("primary failed over")
	r.revokeAll(failover)
	<-a.Lost()
	assert.ErrorIs(t, a.Err(), failover)
	assert.False(t, a.Valid())
	assert.Zero(t, r.tracked(), "a lost lock is untracked")
}
