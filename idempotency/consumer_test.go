package idempotency_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
	consumer, err := idempotency.NewConsumer(b)
	require.NoError(t, err)
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
	consumer, err := idempotency.NewConsumer(barrier(t, store(t)))
	require.NoError(t, err)
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
