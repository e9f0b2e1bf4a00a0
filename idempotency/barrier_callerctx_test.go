package idempotency_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
)

// closeBarrier closes b, waiting for its runs in flight (at most 10 s).
func closeBarrier(t *testing.T, b *idempotency.Barrier) {
	t.Helper()
	closer, ok := any(b).(interface{ Close(context.Context) error })
	require.True(t, ok, "a Barrier has Close(ctx)")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, closer.Close(ctx), "every run in flight finished")
}

// bookThenCallerLeaves is a handler that books (charges), then has its
// caller's ctx end (a shutdown signal, an RPC deadline: cancel), and then
// finishes its work: it returns "booked" once release is closed (or, should
// its own ctx end first, at once). returned is closed when it returns.
func bookThenCallerLeaves(charges *atomic.Int32, cancel func(), release <-chan struct{}, returned chan<- struct{}) idempotency.Handler {
	return func(ctx context.Context, fence uint64) ([]byte, error) {
		defer close(returned)
		charges.Add(1)
		cancel()
		select {
		case <-release:
		case <-ctx.Done():
		}
		return []byte("booked"), nil
	}
}

// The caller's ctx ends while the handler runs under a valid lock: the
// handler is not cancelled by it, Do returns at once with the caller's
// error (before the handler finishes), and the handler's outcome is
// recorded, so that the retry replays it: one charge.
func TestDoWhoseCallerLeftRecordsTheOutcome(t *testing.T) {
	c := store(t)
	b := barrier(t, c)
	var charges atomic.Int32
	cctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	release, returned := make(chan struct{}), make(chan struct{})
	req := idempotency.Request{Key: "pay:caller-left"}

	_, err := b.Do(cctx, req, bookThenCallerLeaves(&charges, cancel, release, returned))
	assert.ErrorIs(t, err, context.Canceled, "the caller gets its ctx's error")
	assert.NotErrorIs(t, err, idempotency.ErrRunCancelled, "the run was not cut short")
	select {
	case <-returned:
		t.Error("Do waited for the handler past its caller's ctx")
	default:
	}
	close(release)

	out, err := b.DoWait(t.Context(), req, 10*time.Second, result(&charges, "charged again"))
	require.NoError(t, err)
	assert.True(t, out.Replayed, "the retry replays the first run")
	assert.Equal(t, "booked", string(out.Result))
	assert.EqualValues(t, 1, charges.Load(), "one charge")
	closeBarrier(t, b)
}

// The same through a Consumer: the message is not acked while its handler
// runs on; once the Barrier is closed (the run recorded), the redelivery
// is acked without running again.
func TestConsumerWhoseCallerLeftRecordsTheOutcome(t *testing.T) {
	c := store(t)
	b := barrier(t, c)
	consumer, err := idempotency.NewConsumer(b)
	require.NoError(t, err)
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

	redelivery, err := idempotency.NewConsumer(barrier(t, c))
	require.NoError(t, err)
	ack, err = redelivery.Handle(t.Context(), "msg-1", result(&charges, "charged again"))
	require.NoError(t, err)
	assert.True(t, ack, "the redelivery replays the recorded run")
	assert.EqualValues(t, 1, charges.Load(), "one charge")
}

// A caller whose ctx ends after its handler returned a Final error: the
// outcome is recorded as the handler returned it, and replayed as stored.
func TestDoWhoseCallerLeftRecordsAFinalError(t *testing.T) {
	c := store(t)
	b := barrier(t, c)
	var charges atomic.Int32
	cctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	req := idempotency.Request{Key: "pay:final"}
	release := make(chan struct{})
	_, err := b.Do(cctx, req, func(ctx context.Context, fence uint64) ([]byte, error) {
		charges.Add(1)
		cancel(errors.New("rpc deadline"))
		<-release
		return nil, idempotency.Final(errors.New("insufficient funds"))
	})
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorContains(t, err, "rpc deadline", "the ctx's cause is kept")
	close(release)
	closeBarrier(t, b)

	_, err = barrier(t, c).Do(t.Context(), req, result(&charges, "charged again"))
	var stored *idempotency.StoredError
	require.ErrorAs(t, err, &stored, "the Final error is replayed")
	assert.Equal(t, "insufficient funds", stored.Message)
	assert.EqualValues(t, 1, charges.Load())
}

// Close waits for the runs in flight; when its ctx ends first it cancels
// their handlers (cause ErrClosed). A handler that then returns an error
// has an unknown outcome: released, and a retry runs it. One that returns
// a success while its lock is valid is recorded. A Barrier closed refuses
// new requests with ErrClosed.
func TestCloseCancelsHandlersAtTheEndOfItsGrace(t *testing.T) {
	c := store(t)
	b := barrier(t, c)
	var charges atomic.Int32
	causes := make(chan error, 2)
	started := make(chan struct{}, 2)
	waitCtx := func(answer []byte, err error) idempotency.Handler {
		return func(ctx context.Context, fence uint64) ([]byte, error) {
			charges.Add(1)
			started <- struct{}{}
			<-ctx.Done()
			causes <- context.Cause(ctx)
			if err != nil {
				return nil, err
			}
			return answer, nil
		}
	}
	cctx, cancel := context.WithCancel(t.Context())
	results := make(chan error, 2)
	go func() {
		_, err := b.Do(cctx, idempotency.Request{Key: "unknown"}, waitCtx(nil, errors.New("stopped half-way")))
		results <- err
	}()
	go func() {
		_, err := b.Do(cctx, idempotency.Request{Key: "done"}, waitCtx([]byte("done anyway"), nil))
		results <- err
	}()
	<-started
	<-started
	cancel() // both callers leave; their runs go on
	for range 2 {
		assert.ErrorIs(t, <-results, context.Canceled)
	}

	grace, end := context.WithCancel(t.Context())
	end() // no grace at all
	err := b.Close(grace)
	assert.ErrorIs(t, err, context.Canceled, "Close gave up waiting")
	for range 2 {
		assert.ErrorIs(t, <-causes, idempotency.ErrClosed, "the handler's ctx was cancelled by Close")
	}
	closeBarrier(t, b) // a second Close waits for them
	_, err = b.Do(t.Context(), idempotency.Request{Key: "new"}, result(&charges, "x"))
	assert.ErrorIs(t, err, idempotency.ErrClosed)

	next := barrier(t, c)
	out, err := next.Do(t.Context(), idempotency.Request{Key: "unknown"}, result(&charges, "ran again"))
	require.NoError(t, err)
	assert.False(t, out.Replayed, "an error returned after Close's cancel is not an outcome")
	out, err = next.Do(t.Context(), idempotency.Request{Key: "done"}, result(&charges, "ran again"))
	require.NoError(t, err)
	assert.True(t, out.Replayed, "a success returned under a valid lock is recorded")
	assert.Equal(t, "done anyway", string(out.Result))
	assert.EqualValues(t, 3, charges.Load())
}
