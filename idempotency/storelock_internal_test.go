package idempotency

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
)

// A grant whose validity is already below the Locker's loss margin when
// its reply comes is born lost: the Locker gives it back at once and
// counts it as not obtained, so no handler runs under it. With the lock
// on the store that grant came with a claim of the record, made in the
// same script: the give-back must undo the claim too, by the attempt's
// token, not only the lock. Forced order: a loss margin of the whole lease
// makes every grant born lost.
func TestBornLostGrantGivesItsClaimBack(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	c := srv.Client()
	const lease = time.Second
	b, err := New(c, WithLease(lease), WithRetention(time.Minute))
	require.NoError(t, err)
	require.NotNil(t, b.onStore, "the default strategy on a one-Redis store")
	normal := b.locker
	born, err := redlease.New(b.strategy, redlease.WithTTL(lease), redlease.WithPrefix(b.prefix+nsLock),
		redlease.WithLossMargin(lease-time.Millisecond))
	require.NoError(t, err)
	b.locker = born
	ctx := t.Context()
	req := Request{Key: "pay:born-lost"}
	rec, lock := b.recordKey(nsRequest, req.Key), b.prefix+nsLock+lockKey(nsRequest, req.Key)
	// A counter at 0: the grants take fences 1, 2 (one created anew would
	// start from the server's clock).
	require.NoError(t, c.Set(ctx, "redlease:fence:{"+lock+"}", "0", time.Minute).Err())

	_, err = b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
		t.Error("a handler ran under a lock born lost")
		return nil, nil
	})
	require.ErrorIs(t, err, ErrInProgress, "not obtained: as if the lock were taken")
	fence, err := c.Get(ctx, "redlease:fence:{"+lock+"}").Int()
	require.NoError(t, err)
	assert.Equal(t, 1, fence, "the grant was made (fence 1)")
	assert.Zero(t, c.Exists(ctx, lock).Val(), "the lock was given back")
	assert.Zero(t, c.Exists(ctx, rec).Val(), "the claim made with it was given back")

	b.locker = normal
	out, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte("paid"), nil })
	require.NoError(t, err)
	assert.EqualValues(t, 2, out.Fence)
}
