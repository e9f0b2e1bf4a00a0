package idempotency_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
)

// A message re-published under its id with another payload can never
// succeed: the Consumer says not to ack it, and Permanent tells the caller
// to dead-letter it instead of letting it be redelivered forever. Errors a
// retry can get past are not permanent.
func TestPoisonMessageIsPermanent(t *testing.T) {
	consumer, err := idempotency.NewConsumer(barrier(t, store(t)))
	require.NoError(t, err)
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
