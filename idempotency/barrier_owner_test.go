package idempotency_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
)

// grantAll is a broken strategy that grants every Acquire, with rising
// fences: a double grant on demand.
type grantAll struct{ fence atomic.Uint64 }

var _ redlease.Strategy = (*grantAll)(nil)

func (g *grantAll) Acquire(_ context.Context, _, _ string, ttl time.Duration) (redlease.Grant, error) {
	return redlease.Grant{Until: time.Now().Add(ttl), Fence: g.fence.Add(1)}, nil
}

func (g *grantAll) Extend(_ context.Context, _, _ string, ttl time.Duration) (redlease.Grant, error) {
	return redlease.Grant{Until: time.Now().Add(ttl)}, nil
}

func (g *grantAll) Release(context.Context, string, string) error { return nil }

// Fencing says it fences: its fences rise.
func (g *grantAll) Fencing() bool { return true }

// Under a double grant both holders believe in their lock, so neither run
// is cancelled; the record's owner check still refuses the result of the
// one that was taken over (the lower fence), and the newer owner's stands.
func TestStaleOwnersCompleteIsRefusedUnderADoubleGrant(t *testing.T) {
	b := barrier(t, store(t), idempotency.WithStrategy(&grantAll{}))
	ctx := t.Context()
	req := idempotency.Request{Key: "double"}
	started, proceed := make(chan struct{}), make(chan struct{})
	stale := make(chan error, 1)
	go func() {
		_, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			close(started)
			<-proceed
			return []byte("stale"), nil
		})
		stale <- err
	}()
	awaitHandler(t, started, stale)
	out, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte("fresh"), nil })
	close(proceed)
	require.NoError(t, err, "the higher fence takes the record over")
	assert.Equal(t, "fresh", string(out.Result))
	staleErr := <-stale
	assert.ErrorIs(t, staleErr, idempotency.ErrNotOwner, "the stale owner's result is refused")
	assert.NotErrorIs(t, staleErr, idempotency.ErrRunCancelled, "its lock was never lost")
	replay, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte("third"), nil })
	require.NoError(t, err)
	assert.True(t, replay.Replayed)
	assert.Equal(t, "fresh", string(replay.Result))
}
