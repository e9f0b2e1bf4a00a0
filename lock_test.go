package redlease_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
)

// Lock.Context ends with the lock: at its deadline (a loss, with the
// lock's error as the cause), at a release sent (no cause of the lock's),
// at stop, and at once on a nil Lock; after stop its cause stays.
func TestLockContextEndsWithTheLock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		locker, err := redlease.New(newFake(), redlease.WithTTL(time.Second))
		require.NoError(t, err)

		lk, err := locker.TryLock(t.Context(), "lost")
		require.NoError(t, err)
		ctx, stop := lk.Context(t.Context())
		deadline := lk.Deadline()
		<-ctx.Done()
		assert.Equal(t, deadline, time.Now(), "cancelled at the lock's deadline")
		assert.ErrorIs(t, context.Cause(ctx), redlease.ErrLost)
		stop()
		assert.ErrorIs(t, context.Cause(ctx), redlease.ErrLost, "stop keeps the cause")

		lk, err = locker.TryLock(t.Context(), "released")
		require.NoError(t, err)
		ctx, stop = lk.Context(t.Context())
		require.NoError(t, lk.Release(t.Context()))
		<-ctx.Done()
		assert.Equal(t, context.Canceled, context.Cause(ctx), "a release is no loss")
		stop()

		lk, err = locker.TryLock(t.Context(), "stopped")
		require.NoError(t, err)
		ctx, stop = lk.Context(t.Context())
		stop()
		assert.Equal(t, context.Canceled, context.Cause(ctx))
		time.Sleep(time.Second)
		assert.Equal(t, context.Canceled, context.Cause(ctx), "detached: the lock's later loss does not reach it")
		assert.False(t, lk.Valid())

		var none *redlease.Lock
		ctx, stop = none.Context(t.Context())
		assert.ErrorIs(t, context.Cause(ctx), redlease.ErrNotHeld)
		stop()
	})
}

func TestLostClosesBeforeValidityRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f, _, lk := fakeLock(t, redlease.WithTTL(time.Second))
		until := lk.Until()
		<-lk.Lost()
		assert.Equal(t, until.Add(-100*time.Millisecond), time.Now(), "Lost closes a tenth of the TTL before Until by default")
		assert.False(t, lk.Valid())
		assert.ErrorIs(t, lk.Err(), redlease.ErrLost)
		assert.ErrorIs(t, lk.Extend(t.Context(), time.Second), redlease.ErrNotHeld, "a lost lock stays lost")

		locker2, err := redlease.New(f, redlease.WithTTL(time.Second), redlease.WithLossMargin(0))
		require.NoError(t, err)
		lk, err = locker2.TryLock(t.Context(), "k2")
		require.NoError(t, err)
		until = lk.Until()
		<-lk.Lost()
		assert.Equal(t, until, time.Now(), "with no margin, Lost closes at Until")
	})
}

func TestNilLockIsSafe(t *testing.T) {
	var lk *redlease.Lock
	ctx := t.Context()
	assert.ErrorIs(t, lk.Release(ctx), redlease.ErrNotHeld)
	assert.ErrorIs(t, lk.Extend(ctx, time.Second), redlease.ErrNotHeld)
	assert.False(t, lk.Valid())
	assert.Empty(t, lk.Key())
	assert.Empty(t, lk.Token())
	assert.Zero(t, lk.Fence())
	assert.True(t, lk.Until().IsZero())
	<-lk.Lost()
}

// Found by the simulator: the first call to Lost made after the lock's
// deadline had passed closed its channel twice (a panic) — once when it
// found the lock expired, once more because it was no longer held.
func TestLostFirstCalledAfterTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, _, lk := fakeLock(t, redlease.WithTTL(time.Second))
		time.Sleep(time.Until(lk.Until())) // past the deadline; Lost never called
		var lost <-chan struct{}
		require.NotPanics(t, func() { lost = lk.Lost() })
		select {
		case <-lost:
		default:
			t.Fatal("Lost is not closed past the deadline")
		}
		assert.ErrorIs(t, lk.Err(), redlease.ErrLost)
	})
}
