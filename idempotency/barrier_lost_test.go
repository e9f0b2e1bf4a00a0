package idempotency_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
)

// The store pauses (SIGSTOP) as the handler starts, with a store client
// on go-redis's default options (no ContextTimeoutEnabled: a call to a
// paused server waits for its 3 s read timeout and retries). The
// request's lock cannot be renewed, so it is lost: the handler must be
// told (its ctx cancelled with ErrLost) before the lock's validity could
// have ended — before Do's start plus the lease — whatever the record's
// renewal, stuck on the same store, is doing. Otherwise a successor could
// be granted the request while this handler still believes it runs alone.
func TestHandlerIsToldOfALostLockWhileTheStoreHangs(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	const lease = 900 * time.Millisecond
	b := barrier(t, c, idempotency.WithLease(lease), idempotency.WithRetention(time.Minute))

	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			srv.Resume()
		}
	}
	t.Cleanup(resume)

	start := time.Now()
	var told time.Time
	var cause error
	_, err := b.Do(t.Context(), idempotency.Request{Key: "pay:1"}, func(ctx context.Context, _ uint64) ([]byte, error) {
		srv.Pause()
		select {
		case <-ctx.Done():
			told, cause = time.Now(), context.Cause(ctx)
		case <-time.After(3 * lease):
		}
		resume()
		return []byte("paid"), nil
	})
	resume()
	require.False(t, told.IsZero(), "the handler was not told within 3 leases that its lock was lost")
	assert.ErrorIs(t, cause, redlease.ErrLost)
	assert.Less(t, told.Sub(start), lease,
		"the handler was told %v after Do began: past the lease (%v), when the store may already grant the request to another run", told.Sub(start), lease)
	assert.True(t, errors.Is(err, idempotency.ErrRunCancelled), "Do: %v", err)
}
