package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
)

// Failures: a Final error is stored and replayed; a transient one releases
// the request so a retry runs; a panic releases and re-panics.
func TestResultPolicy(t *testing.T) {
	b := barrier(t, store(t))
	ctx := t.Context()
	insufficient := errors.New("insufficient funds")
	_, err := b.Do(ctx, idempotency.Request{Key: "final"}, func(context.Context, uint64) ([]byte, error) {
		return nil, idempotency.Final(insufficient)
	})
	assert.ErrorIs(t, err, insufficient)
	_, err = b.Do(ctx, idempotency.Request{Key: "final"}, func(context.Context, uint64) ([]byte, error) { return []byte("ran again"), nil })
	var stored *idempotency.StoredError
	require.ErrorAs(t, err, &stored, "a definitive failure is replayed")
	assert.Equal(t, "insufficient funds", stored.Message)

	_, err = b.Do(ctx, idempotency.Request{Key: "transient"}, func(context.Context, uint64) ([]byte, error) {
		return nil, errors.New("db timeout")
	})
	require.Error(t, err)
	out, err := b.Do(ctx, idempotency.Request{Key: "transient"}, func(context.Context, uint64) ([]byte, error) { return []byte("retried"), nil })
	require.NoError(t, err, "a transient failure lets the retry run")
	assert.Equal(t, "retried", string(out.Result))

	assert.Panics(t, func() {
		_, _ = b.Do(ctx, idempotency.Request{Key: "panic"}, func(context.Context, uint64) ([]byte, error) { panic("boom") })
	})
	out, err = b.Do(ctx, idempotency.Request{Key: "panic"}, func(context.Context, uint64) ([]byte, error) { return []byte("after panic"), nil })
	require.NoError(t, err)
	assert.Equal(t, "after panic", string(out.Result))

	all := barrier(t, store(t), idempotency.WithStoreEverything())
	_, _ = all.Do(ctx, idempotency.Request{Key: "t"}, func(context.Context, uint64) ([]byte, error) { return nil, errors.New("db timeout") })
	_, err = all.Do(ctx, idempotency.Request{Key: "t"}, func(context.Context, uint64) ([]byte, error) { return []byte("no"), nil })
	require.ErrorAs(t, err, &stored, "WithStoreEverything replays any outcome")
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

// errCallerGone is the cause the test ends the caller's ctx with.
var errCallerGone = errors.New("caller gone")

// A duplicate whose caller's ctx ends while its lock attempt is in flight,
// and whose attempt the store then answers "held by another token", is
// told ErrInProgress (the store's answer: another run holds the request),
// through Do and through the Consumer, never the lock's bare
// ErrNotObtained. The order is forced: the gate holds the claim's reply,
// the ctx ends, then the reply is let through. The client honours
// contexts (ContextTimeoutEnabled) and the ctx has no deadline, so the
// call waits for the reply instead of being abandoned at the ctx's end.
func TestDuplicateRefusedAfterItsCallerLeftIsInProgress(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	ctx := t.Context()
	for _, via := range []string{"do", "consumer"} {
		t.Run(via, func(t *testing.T) {
			gate := redistest.NewGate(t, srv.Addr)
			c := redis.NewClient(&redis.Options{Addr: gate.Addr, ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			warm(t, c)
			key := "pay:held-" + via

			// The first run holds the request (and its lock) until the
			// test lets it finish.
			first := barrier(t, srv.Client())
			fcons := newConsumer(t, first)
			started, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
			hold := func(context.Context, uint64) ([]byte, error) {
				close(started)
				<-release
				return []byte("paid"), nil
			}
			go func() {
				if via == "do" {
					_, err := first.Do(ctx, idempotency.Request{Key: key}, hold)
					done <- err
					return
				}
				_, err := fcons.Handle(ctx, key, hold)
				done <- err
			}()
			defer func() {
				close(release)
				assert.NoError(t, <-done, "the first run completes")
				closeBarrier(t, first)
			}()
			redistest.Await(t, probe, started, 10*time.Second, 3, "the first run did not start")

			dup := barrier(t, c)
			cons := newConsumer(t, dup)
			gate.HoldReplies(key)
			dctx, cancel := context.WithCancelCause(ctx)
			defer cancel(nil)
			type answer struct {
				ack bool
				err error
			}
			got := make(chan answer, 1)
			ran := make(chan struct{}, 1)
			h := func(context.Context, uint64) ([]byte, error) {
				ran <- struct{}{}
				return nil, nil
			}
			go func() {
				if via == "do" {
					_, err := dup.Do(dctx, idempotency.Request{Key: key}, h)
					got <- answer{err: err}
					return
				}
				ack, err := cons.Handle(dctx, key, h)
				got <- answer{ack: ack, err: err}
			}()
			// The claim was sent and answered "held" (a negative PTTL);
			// the reply is held at the gate.
			require.NoError(t, gate.WaitHeld(1, ":-", 10*time.Second), "the store's refusal is held")
			cancel(errCallerGone)
			gate.HoldReplies("")
			require.NoError(t, gate.Step(":-", 10*time.Second))
			a := redistest.Await(t, probe, got, 10*time.Second, 3, "the duplicate's call did not return")
			gate.Open()
			assert.Empty(t, ran, "the duplicate's handler never ran")
			require.Error(t, a.err)
			assert.False(t, a.ack, "an in-progress message is not acked")
			assert.ErrorIs(t, a.err, idempotency.ErrInProgress, "the store said another run holds the request: %v", a.err)
			var ip *idempotency.InProgressError
			assert.ErrorAs(t, a.err, &ip, "with a retry hint")
			if errors.Is(a.err, redlease.ErrNotObtained) {
				t.Errorf("the lock's bare refusal reached the caller: %v", a.err)
			}
		})
	}
}

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
