package idempotency_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
)

// DoWait waits only for the Barrier's own "in progress". A handler that
// returns an in-progress error of its own (a downstream 409 mapped to
// ErrInProgress, a nested Barrier) has a result: a transient failure,
// released and returned at once, not waited on and run again.
func TestDoWaitReturnsAHandlersOwnInProgress(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []idempotency.Option
	}{
		{"default", nil},
		{"WithStoreEverything", []idempotency.Option{idempotency.WithStoreEverything()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := barrier(t, store(t), c.opts...)
			ctx := t.Context()
			req := idempotency.Request{Key: "nested"}
			var runs atomic.Int32
			downstream := &idempotency.InProgressError{RetryAfter: time.Second} // the ledger's 409
			probe := redistest.StartStallProbe(t)
			start := time.Now()
			_, err := b.DoWait(ctx, req, 2*time.Second, func(context.Context, uint64) ([]byte, error) {
				runs.Add(1)
				return nil, fmt.Errorf("ledger: %w", downstream)
			})
			elapsed := time.Since(start)
			assert.ErrorIs(t, err, idempotency.ErrInProgress, "the handler's error, returned to the caller")
			assert.EqualValues(t, 1, runs.Load(), "the handler ran once in one DoWait")
			assertWithin(t, probe, time.Second, start, elapsed, "not waited on")

			out, err := b.Do(ctx, req, result(&runs, "booked"))
			require.NoError(t, err, "released as a transient failure: the retry runs")
			assert.False(t, out.Replayed)
			assert.Equal(t, "booked", string(out.Result))
		})
	}
}
