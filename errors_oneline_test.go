package redlease_test

import (
	"context"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
)

// Errors read as one line with the "redlease:" prefix once: an Extend of a
// lock that ran out, a Lock whose ctx ended.
func TestErrorsAreOneLineWithOnePrefix(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		l, err := redlease.New(f, redlease.WithTTL(time.Second), redlease.WithoutKeeper())
		require.NoError(t, err)
		lk, err := l.TryLock(t.Context(), "k")
		require.NoError(t, err)
		time.Sleep(time.Until(lk.Until()))
		err = lk.Extend(t.Context(), time.Second)
		require.ErrorIs(t, err, redlease.ErrNotHeld)
		require.ErrorIs(t, err, redlease.ErrLost)
		for _, e := range []error{err, lk.Err()} {
			assert.NotContains(t, e.Error(), "\n")
			assert.Equal(t, 1, strings.Count(e.Error(), "redlease:"), "%s", e)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err = l.Lock(ctx, "k2")
		require.ErrorIs(t, err, redlease.ErrNotObtained)
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, 1, strings.Count(err.Error(), "redlease:"), "%s", err)
		assert.Equal(t, 1, strings.Count(err.Error(), "context canceled"), "%s", err)
	})
}

func TestWrapShowsThePrefixOnce(t *testing.T) {
	err := redlease.Wrap(redlease.ErrNotObtained, failover.ErrNotReplicated)
	assert.Equal(t, "redlease: lock not obtained: write not acknowledged by enough replicas", err.Error())
	assert.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.ErrorIs(t, err, failover.ErrNotReplicated)
	assert.Same(t, redlease.ErrLost, redlease.Wrap(redlease.ErrLost, nil))
}
