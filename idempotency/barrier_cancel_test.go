package idempotency_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
)

// untilDone is a handler body that waits for its ctx to end, or fails the
// run if it has not ended within 5 s plus 3 × what probe measured this
// process stalled meanwhile.
func untilDone(ctx context.Context, t *testing.T, probe *redistest.StallProbe) error {
	soft := &redistest.SoftTB{TB: t}
	redistest.Await(soft, probe, ctx.Done(), 5*time.Second, 3, "the handler's ctx never ended")
	if soft.Failed() != "" {
		return errors.New(soft.Failed())
	}
	return nil
}

// A handler whose lock is lost while it runs, and that returns a result
// anyway (it did not look at its ctx in time): its outcome is unknown, so
// nothing is recorded, the record is released, and the retry runs.
func TestRunWithALostLockIsNotRecorded(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	b := barrier(t, store(t), idempotency.WithLease(200*time.Millisecond), idempotency.WithRetention(time.Minute))
	ctx := t.Context()
	req := idempotency.Request{Key: "lost-lock"}
	var runs atomic.Int32
	out, err := b.Do(ctx, req, func(ctx context.Context, fence uint64) ([]byte, error) {
		runs.Add(1)
		if err := untilDone(ctx, t, probe); err != nil { // no Keeper: the lock is lost at the end of the lease
			return nil, err
		}
		return []byte("partial"), nil
	})
	t.Logf("%v", err)
	assert.ErrorIs(t, err, idempotency.ErrRunCancelled)
	assert.ErrorIs(t, err, redlease.ErrLost, "context.Cause: the lock was lost")
	assert.Nil(t, out.Result, "an unknown outcome is not handed out as a result")

	out, err = b.Do(ctx, req, result(&runs, "complete"))
	require.NoError(t, err, "the retry runs")
	assert.False(t, out.Replayed, "the cancelled run was not recorded")
	assert.Equal(t, "complete", string(out.Result))
	assert.EqualValues(t, 2, runs.Load())
}

// WithStoreEverything stores every outcome of a run — but a run aborted by
// the loss of its lock has no outcome: its "context canceled" must not be
// replayed forever.
func TestStoreEverythingDoesNotStoreARunAbortedByItsLostLock(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	b := barrier(t, store(t), idempotency.WithStoreEverything(),
		idempotency.WithLease(200*time.Millisecond), idempotency.WithRetention(time.Minute))
	ctx := t.Context()
	req := idempotency.Request{Key: "aborted"}
	var runs atomic.Int32
	_, err := b.Do(ctx, req, func(ctx context.Context, fence uint64) ([]byte, error) {
		runs.Add(1)
		if err := untilDone(ctx, t, probe); err != nil {
			return nil, err
		}
		return nil, ctx.Err() // what a handler that honours its ctx returns
	})
	assert.ErrorIs(t, err, idempotency.ErrRunCancelled)
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorIs(t, err, redlease.ErrLost, "context.Cause says why")

	out, err := b.Do(ctx, req, result(&runs, "done"))
	require.NoError(t, err, "not a replay of the aborted run")
	assert.False(t, out.Replayed)
	assert.Equal(t, "done", string(out.Result))
	assert.EqualValues(t, 2, runs.Load())
}
