package idempotency_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
)

// refuseAfter is a lock strategy that refuses every Acquire as taken, after
// running before once (inside the first Acquire, between the Barrier's
// look at the record and the lock's answer).
type refuseAfter struct {
	once   sync.Once
	before func()
}

var _ redlease.Strategy = (*refuseAfter)(nil)

func (r *refuseAfter) Acquire(context.Context, string, string, time.Duration) (redlease.Grant, error) {
	r.once.Do(r.before)
	return redlease.Grant{}, &redlease.HeldError{Remaining: time.Second}
}

func (r *refuseAfter) Extend(context.Context, string, string, time.Duration) (redlease.Grant, error) {
	return redlease.Grant{}, redlease.ErrNotHeld
}

func (r *refuseAfter) Release(context.Context, string, string) error { return redlease.ErrNotHeld }

// Fencing says it fences (it never grants): a Barrier takes only a
// strategy that does.
func (r *refuseAfter) Fencing() bool { return true }

// With a lock that is not on the store (quorum, for money), the Barrier
// looks at the record and then takes the lock: two steps. A duplicate whose
// look found the request in flight, and whose lock was then refused, may
// come after the request completed in between (on quorum, its lock's
// release may still be landing on some nodes). It gets the stored result,
// not "in progress, retry in a second".
func TestDuplicateRefusedAfterTheFirstCompletedGetsTheResult(t *testing.T) {
	c := store(t)
	ctx := t.Context()
	req := idempotency.Request{Key: "settle:7", Fingerprint: idempotency.Fingerprint("u7", "pay", "70")}
	first := barrier(t, c) // the lock on the store: another process's Barrier
	completeFirst := func() {
		out, err := first.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte("paid"), nil })
		require.NoError(t, err)
		require.False(t, out.Replayed)
	}
	dup := barrier(t, c, idempotency.WithStrategy(&refuseAfter{before: completeFirst}))
	out, err := dup.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
		t.Error("the duplicate's handler ran")
		return nil, nil
	})
	require.NoError(t, err, "a completed request answers with its result")
	assert.True(t, out.Replayed)
	assert.Equal(t, "paid", string(out.Result))

	// A different payload completed meanwhile is a mismatch, not "in progress".
	other := idempotency.Request{Key: "settle:8", Fingerprint: idempotency.Fingerprint("u8", "pay", "80")}
	completeOther := func() {
		_, err := first.Do(ctx, other, func(context.Context, uint64) ([]byte, error) { return []byte("paid"), nil })
		require.NoError(t, err)
	}
	dup = barrier(t, c, idempotency.WithStrategy(&refuseAfter{before: completeOther}))
	_, err = dup.Do(ctx, idempotency.Request{Key: "settle:8", Fingerprint: idempotency.Fingerprint("u8", "pay", "81")},
		func(context.Context, uint64) ([]byte, error) { return nil, nil })
	assert.ErrorIs(t, err, idempotency.ErrMismatch)

	// A request still in flight stays "in progress".
	dup = barrier(t, c, idempotency.WithStrategy(&refuseAfter{before: func() {}}))
	_, err = dup.Do(ctx, idempotency.Request{Key: "settle:9"}, func(context.Context, uint64) ([]byte, error) { return nil, nil })
	assert.ErrorIs(t, err, idempotency.ErrInProgress)
}
