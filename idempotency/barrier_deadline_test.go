package idempotency_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
)

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
			fcons, err := idempotency.NewConsumer(first)
			require.NoError(t, err)
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
			cons, err := idempotency.NewConsumer(dup)
			require.NoError(t, err)
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
