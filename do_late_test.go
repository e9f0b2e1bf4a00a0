package redlease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
)

// lateGrants grants like fake, but with less validity left than the loss
// margin, as a grant whose reply came back late does.
type lateGrants struct{ *fake }

func (s lateGrants) Acquire(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	g, err := s.fake.Acquire(ctx, key, token, ttl)
	if err == nil {
		g.Until = time.Now().Add(ttl / 20)
	}
	return g, err
}

// Do never starts fn with a lock already past its deadline (Until less
// the loss margin): such a lock is as good as lost, and fn would start
// work its ctx cancels a moment later — or, if the goroutine that cancels
// it is slow, after Until, when another holder may already be granted.
func TestDoDoesNotStartFnWithALockPastItsDeadline(t *testing.T) {
	l, err := redlease.New(lateGrants{newFake()}, redlease.WithTTL(time.Second), redlease.WithoutKeeper())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond) // Lock tries again until then
	defer cancel()
	err = l.Do(ctx, "k", func(context.Context, *redlease.Lock) error {
		t.Error("fn started with a lock past its deadline")
		return nil
	})
	// (Lock tried until its ctx ended: its error may be that of an attempt
	// or of the ctx alone.)
	assert.ErrorIs(t, err, redlease.ErrNotObtained)

	// TryLock gives such a grant back and says not obtained, because the
	// lock was born lost.
	lk, err := l.TryLock(t.Context(), "k2")
	assert.Nil(t, lk)
	assert.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.ErrorIs(t, err, redlease.ErrLost)
}
