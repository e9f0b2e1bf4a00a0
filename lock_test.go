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
