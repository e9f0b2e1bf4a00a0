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

// The store pauses (SIGSTOP) as the handler starts, with a store client
// on go-redis's default options (no ContextTimeoutEnabled: a call to a
// paused server waits for its 3 s read timeout and retries). The
// request's lock cannot be renewed, so it is lost: the handler must be
// told (its ctx cancelled with ErrLost) before the lock's validity could
// have ended — before Do's start plus the lease — whatever the record's
// renewal, stuck on the same store, is doing. Otherwise a successor could
// be granted the request while this handler still believes it runs alone.
func TestHandlerIsToldOfALostLockWhileTheStoreHangs(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	srv, c := defaultClientStore(t)
	const lease = 900 * time.Millisecond
	b := barrier(t, c, idempotency.WithLease(lease), idempotency.WithRetention(time.Minute))

	start := time.Now()
	var told time.Time
	var cause error
	_, err := b.Do(t.Context(), idempotency.Request{Key: "pay:1"}, func(ctx context.Context, _ uint64) ([]byte, error) {
		srv.Pause()
		// Told by the lease's end, or as much later as stallMultiple
		// times this process's measured stall (bounded: 10 ms a round).
		for range 10_000 {
			if ctx.Err() != nil || time.Since(start) > probe.Allowance(lease, stallMultiple, start, time.Now()) {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
		if ctx.Err() != nil {
			told, cause = time.Now(), context.Cause(ctx)
		}
		srv.Resume()
		return []byte("paid"), nil
	})
	require.False(t, told.IsZero(), "the handler was not told that its lock was lost: %s", probe.Explain(lease, stallMultiple, start, time.Now()))
	assert.ErrorIs(t, cause, redlease.ErrLost)
	// Past the lease the store may already grant the request to another
	// run: the handler is told before, unless this process could not run
	// a timer for at least as long as the overrun (the documented limit),
	// measured from 0.8 of the lease (the lock's deadline is no earlier:
	// Until less the loss margin, a tenth of the lease, and the drift
	// allowance) to the notice.
	if over := told.Sub(start) - lease; over >= 0 {
		stall := probe.Worst(start.Add(lease*8/10), told)
		if stall < over {
			t.Errorf("the handler was told %v after Do began: past the lease (%v), when the store may already grant the request to another run, while this process's timers were at most %v late", told.Sub(start), lease, stall)
		} else {
			t.Logf("the handler was told %v past the lease, during a measured stall of %v", over, stall)
		}
	}
	assert.True(t, errors.Is(err, idempotency.ErrRunCancelled), "Do: %v", err)
}

// Found by the simulator (barrier scenario, seed 15380, with the
// handler-overlap invariant). A's claim of the record is applied while its
// lock is valid, but the reply comes back only after the lock ran out and
// B took the request over and started its handler. A must not start its
// handler then: its lock is gone, and B runs. Forced order: the reply to
// A's claim is held in a gate until B's handler runs.
func TestNoHandlerStartsAfterItsLockRanOut(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	gate := redistest.NewGate(t, srv.Addr)
	slow := redis.NewClient(&redis.Options{Addr: gate.Addr, ReadTimeout: 30 * time.Second})
	t.Cleanup(func() { _ = slow.Close() })
	const lease = 300 * time.Millisecond
	// 61 s of retention: "61000" is in A's claim (not in its peek).
	a := barrier(t, slow, idempotency.WithLease(lease), idempotency.WithRetention(61*time.Second))
	b := barrier(t, srv.Client(), idempotency.WithLease(lease), idempotency.WithRetention(61*time.Second))
	ctx := t.Context()
	req := idempotency.Request{Key: "settle:9"}
	fenceFromZero(t, srv.Client(), requestLock("idem:", req.Key))

	// Load the scripts first (a first EVALSHA answers NOSCRIPT).
	_, err := a.Do(ctx, idempotency.Request{Key: "warm-up"}, func(context.Context, uint64) ([]byte, error) { return nil, nil })
	require.NoError(t, err)

	gate.HoldReplies("61000")
	aStarted := make(chan struct{}, 1)
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			aStarted <- struct{}{}
			return []byte("a"), nil
		})
		aDone <- err
	}()
	require.NoError(t, gate.WaitHeld(1, claimedFence1, 5*time.Second), "the reply to A's claim is held")
	gate.HoldReplies("")

	var bOut idempotency.Outcome
	for range 100 {
		bOut, err = b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			gate.Open() // A learns it claimed the record, long after its lock ran out
			var aErr error
			returned := false
			soft := &redistest.SoftTB{TB: t}
			probe.WaitFor(soft, 2*time.Second, 3, time.Millisecond, func() bool {
				select {
				case aErr = <-aDone:
					returned = true
				default:
				}
				return returned
			}, "A's Do did not return after its claim's reply")
			if returned {
				aDone <- aErr
			} else {
				t.Error(soft.Failed())
			}
			return []byte("b"), nil
		})
		if !errors.Is(err, idempotency.ErrInProgress) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, err)
	assert.Equal(t, "b", string(bOut.Result))
	select {
	case <-aStarted:
		t.Error("A's handler started after its lock ran out, while B's ran")
	default:
	}
	aErr := <-aDone
	t.Logf("A: %v", aErr)
	assert.ErrorIs(t, aErr, idempotency.ErrInProgress, "A: nothing ran; B has the request")
}
