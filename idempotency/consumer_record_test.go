package idempotency_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
)

// A message whose handler ran but whose outcome the store would not take
// (for as long as the message's lock was held) is acked: its effect may
// have happened, and a redelivery would repeat it. A Final outcome that
// could not be stored is not "recorded" either: the error says so.
func TestConsumerAcksAnOutcomeThatCouldNotBeRecorded(t *testing.T) {
	insufficient := errors.New("insufficient funds")
	for _, c := range []struct {
		name string
		mark string // only the complete requests carry it
		h    func(runs *atomic.Int32, mark string) idempotency.Handler
	}{
		{"success", "settled-2b7e", func(runs *atomic.Int32, mark string) idempotency.Handler {
			return result(runs, mark)
		}},
		{"Final error", "declined-9d04", func(runs *atomic.Int32, mark string) idempotency.Handler {
			return func(context.Context, uint64) ([]byte, error) {
				runs.Add(1)
				return nil, idempotency.Final(errors.Join(insufficient, errors.New(mark)))
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, gate, _ := heldStore(t, idempotency.WithLease(500*time.Millisecond), idempotency.WithRetention(time.Minute))
			consumer, err := idempotency.NewConsumer(b)
			require.NoError(t, err)
			ctx := t.Context()
			var runs atomic.Int32
			gate.HoldRequests(c.mark)
			ack, err := consumer.Handle(ctx, "msg-1", c.h(&runs, c.mark))
			t.Logf("ack %v: %v", ack, err)
			assert.True(t, ack, "the effect may have happened: ack, do not run it again (err: %v)", err)
			assert.ErrorIs(t, err, idempotency.ErrNotRecorded)
			var netErr net.Error
			assert.ErrorAs(t, err, &netErr, "the store error is kept")
			if c.name == "Final error" {
				assert.ErrorIs(t, err, insufficient, "the handler's outcome is kept")
			}
			assert.EqualValues(t, 1, runs.Load())
			land(t, gate) // let the held requests finish before the next subtest
		})
	}
}
