package idempotency_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
)

// A Redis Streams consumer group delivers at least once. A message
// redelivered through XAUTOCLAIM while its first consumer still runs must
// not be handled twice nor acked early; once the first consumer finished,
// the redelivery is acked without running again.
func TestStreamRedeliveryWhileFirstConsumerRuns(t *testing.T) {
	c := store(t)
	ctx := t.Context()
	b := barrier(t, c)
	consumer := newConsumer(t, b)
	require.NoError(t, c.XGroupCreateMkStream(ctx, "orders", "settle", "0").Err())
	require.NoError(t, c.XAdd(ctx, &redis.XAddArgs{Stream: "orders", Values: map[string]any{"order": "o-1", "amount": "100"}}).Err())

	var effects atomic.Int32
	release := make(chan struct{})
	entered := make(chan struct{}, 2)
	handler := func(ctx context.Context, fence uint64) ([]byte, error) {
		effects.Add(1)
		entered <- struct{}{}
		<-release // the first consumer is slow
		return []byte("settled"), nil
	}

	got, err := c.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "settle", Consumer: "c1", Streams: []string{"orders", ">"}, Count: 1}).Result()
	require.NoError(t, err)
	msg := got[0].Messages[0]
	firstAck := make(chan bool, 1)
	firstErr := make(chan error, 1)
	go func() {
		ack, err := consumer.Handle(ctx, msg.Values["order"].(string), handler)
		assert.NoError(t, err)
		firstErr <- err
		firstAck <- ack
	}()
	awaitHandler(t, entered, firstErr) // c1 runs the handler

	// c2 claims the message, idle for a moment (past MinIdle), as a rebalance would.
	time.Sleep(50 * time.Millisecond)
	claimed, _, err := c.XAutoClaim(ctx, &redis.XAutoClaimArgs{Stream: "orders", Group: "settle", Consumer: "c2", MinIdle: 20 * time.Millisecond, Start: "0"}).Result()
	require.NoError(t, err)
	require.Len(t, claimed, 1, "the redelivery")
	ack, err := consumer.Handle(ctx, claimed[0].Values["order"].(string), handler)
	assert.False(t, ack, "still being handled by c1: do not ack")
	assert.True(t, errors.Is(err, idempotency.ErrInProgress), "%v", err)

	close(release)
	require.True(t, <-firstAck)
	require.NoError(t, c.XAck(ctx, "orders", "settle", msg.ID).Err())

	ack, err = consumer.Handle(ctx, claimed[0].Values["order"].(string), handler)
	require.NoError(t, err)
	assert.True(t, ack, "done by c1: the redelivery is acked without running")
	assert.EqualValues(t, 1, effects.Load())
}

// A message re-published under the same id with another payload is
// refused, not silently replayed.
func TestHandlePayloadRefusesAChangedMessage(t *testing.T) {
	consumer := newConsumer(t, barrier(t, store(t)))
	ctx := t.Context()
	ok := func(context.Context, uint64) ([]byte, error) { return []byte("done"), nil }
	ack, err := consumer.HandlePayload(ctx, "order-9", []byte(`{"amount":100}`), ok)
	require.NoError(t, err)
	assert.True(t, ack)
	ack, err = consumer.HandlePayload(ctx, "order-9", []byte(`{"amount":100}`), ok)
	require.NoError(t, err)
	assert.True(t, ack, "the same message again: replayed, ack it")
	ack, err = consumer.HandlePayload(ctx, "order-9", []byte(`{"amount":999}`), ok)
	assert.ErrorIs(t, err, idempotency.ErrMismatch)
	assert.False(t, ack)
}

// The same through a Consumer: the message is not acked while its handler
// runs on; once the Barrier is closed (the run recorded), the redelivery
// is acked without running again.
func TestConsumerWhoseCallerLeftRecordsTheOutcome(t *testing.T) {
	c := store(t)
	b := barrier(t, c)
	consumer := newConsumer(t, b)
	var charges atomic.Int32
	cctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	release, returned := make(chan struct{}), make(chan struct{})

	ack, err := consumer.Handle(cctx, "msg-1", bookThenCallerLeaves(&charges, cancel, release, returned))
	assert.False(t, ack, "not acked: its outcome is not recorded yet")
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, idempotency.ErrRunCancelled, "the run was not cut short")
	select {
	case <-returned:
		t.Error("Handle waited for the handler past its caller's ctx")
	default:
	}
	close(release)
	closeBarrier(t, b)

	redelivery := newConsumer(t, barrier(t, c))
	ack, err = redelivery.Handle(t.Context(), "msg-1", result(&charges, "charged again"))
	require.NoError(t, err)
	assert.True(t, ack, "the redelivery replays the recorded run")
	assert.EqualValues(t, 1, charges.Load(), "one charge")
}

// A message re-published under its id with another payload can never
// succeed: the Consumer says not to ack it, and Permanent tells the caller
// to dead-letter it instead of letting it be redelivered forever. Errors a
// retry can get past are not permanent.
func TestPoisonMessageIsPermanent(t *testing.T) {
	consumer := newConsumer(t, barrier(t, store(t)))
	ctx := t.Context()
	ok := func(context.Context, uint64) ([]byte, error) { return []byte("done"), nil }
	ack, err := consumer.HandlePayload(ctx, "order-9", []byte(`{"amount":100}`), ok)
	require.NoError(t, err)
	require.True(t, ack)

	ack, err = consumer.HandlePayload(ctx, "order-9", []byte(`{"amount":999}`), ok)
	assert.False(t, ack)
	assert.ErrorIs(t, err, idempotency.ErrMismatch)
	assert.True(t, idempotency.Permanent(err), "a payload mismatch never succeeds: dead-letter it")
	for i := range 3 {
		_, again := consumer.HandlePayload(ctx, "order-9", []byte(`{"amount":999}`), ok)
		assert.True(t, idempotency.Permanent(again), "redelivery %d", i)
	}

	ack, err = consumer.Handle(ctx, "", ok)
	assert.False(t, ack)
	assert.ErrorIs(t, err, redlease.ErrInvalid)
	assert.True(t, idempotency.Permanent(err), "a message without an id never succeeds")

	_, err = consumer.Handle(ctx, "order-10", func(context.Context, uint64) ([]byte, error) {
		return nil, errors.New("db timeout")
	})
	assert.False(t, idempotency.Permanent(err), "a transient failure: %v", err)
	_, err = consumer.Handle(ctx, "order-11", nil)
	assert.ErrorIs(t, err, redlease.ErrInvalid)
	assert.False(t, idempotency.Permanent(err), "the program's mistake, not the message's: fixed, the message goes through")
	assert.False(t, idempotency.Permanent(idempotency.ErrInProgress))
	assert.False(t, idempotency.Permanent(nil))
}

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
			consumer := newConsumer(t, b)
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

// newConsumer is idempotency.NewConsumer(b); an error fails t.
func newConsumer(t *testing.T, b *idempotency.Barrier) *idempotency.Consumer {
	t.Helper()
	c, err := idempotency.NewConsumer(b)
	require.NoError(t, err)
	return c
}
