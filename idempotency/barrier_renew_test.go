package idempotency_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/renew"
)

// A handler whose lock a Keeper renews past the retention keeps its
// in-progress record for as long: the record is not lost to its TTL (set
// once at claim), a duplicate meanwhile is told "in progress", the result
// is stored, and the handler runs once. The lease is 2 s: the watchdog's
// renewals then ride out a stall of about 0.64 of it (see
// TestDuplicateDuringSlowRenewedHandler); with 300 ms the lock was lost
// ("validity ran out without an extension") in a -race run beside other
// tests at load 9.
func TestRenewedHandlerOutlivingTheRetentionKeepsItsRecord(t *testing.T) {
	w, err := renew.New()
	require.NoError(t, err)
	defer w.Close()
	c := store(t)
	const (
		lease     = 2 * time.Second
		retention = lease + lease/4
	)
	b := barrier(t, c, idempotency.WithLease(lease), idempotency.WithRetention(retention), idempotency.WithKeeper(w))
	ctx := t.Context()
	req := idempotency.Request{Key: "long"}
	var runs atomic.Int32
	running := make(chan struct{}, 1)
	h := func(ctx context.Context, fence uint64) ([]byte, error) {
		runs.Add(1)
		select {
		case running <- struct{}{}:
		default:
		}
		select {
		case <-time.After(retention * 3 / 2):
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		return []byte("booked"), nil
	}
	type done struct {
		out idempotency.Outcome
		err error
	}
	first := make(chan done, 1)
	go func() {
		out, err := b.Do(ctx, req, h)
		first <- done{out, err}
	}()
	<-running
	time.Sleep(retention * 6 / 5) // past the TTL the record was claimed with

	n, err := c.Exists(ctx, "idem:r:long").Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "the in-progress record outlives the retention while its lock is held")
	_, err = b.Do(ctx, req, h)
	assert.ErrorIs(t, err, idempotency.ErrInProgress, "a duplicate meanwhile does not run")

	got := <-first
	require.NoError(t, got.err, "the result is stored")
	assert.Equal(t, "booked", string(got.out.Result))
	out, err := b.Do(ctx, req, h)
	require.NoError(t, err)
	assert.True(t, out.Replayed, "a duplicate afterwards gets the stored result")
	assert.EqualValues(t, 1, runs.Load(), "the handler ran once")
}
