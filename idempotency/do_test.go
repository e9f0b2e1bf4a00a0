package idempotency_test

import (
	"context"
	"errors"
	"fmt"
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

func TestFirstRunsDuplicatesReplay(t *testing.T) {
	b := barrier(t, store(t))
	ctx := t.Context()
	req := idempotency.Request{Key: "order:1", Fingerprint: idempotency.Fingerprint("u1", "pay", "100")}
	var runs atomic.Int32
	h := func(ctx context.Context, fence uint64) ([]byte, error) {
		runs.Add(1)
		return []byte(fmt.Sprintf("paid with fence %d", fence)), nil
	}
	first, err := b.Do(ctx, req, h)
	require.NoError(t, err)
	assert.False(t, first.Replayed)
	assert.NotZero(t, first.Fence)
	second, err := b.Do(ctx, req, h)
	require.NoError(t, err)
	assert.True(t, second.Replayed)
	assert.Equal(t, first.Result, second.Result)
	assert.EqualValues(t, 1, runs.Load())
}

// The fingerprint of the first request survives its completion: the same
// key with another payload is refused afterwards, not replayed.
func TestFingerprintSurvivesCompletion(t *testing.T) {
	b := barrier(t, store(t))
	ctx := t.Context()
	ok := func(context.Context, uint64) ([]byte, error) { return []byte("ok"), nil }
	_, err := b.Do(ctx, idempotency.Request{Key: "k", Fingerprint: idempotency.PayloadHash([]byte("amount=100"))}, ok)
	require.NoError(t, err)
	_, err = b.Do(ctx, idempotency.Request{Key: "k", Fingerprint: idempotency.PayloadHash([]byte("amount=999"))}, ok)
	assert.ErrorIs(t, err, idempotency.ErrMismatch)
}

// claimRefusals is a go-redis hook that sends on refused each time a claim
// (the script sha: ClaimLockHash) is answered with the lock held by
// someone else (a negative integer), without waiting for a receiver.
type claimRefusals struct {
	sha     string
	refused chan<- struct{}
}

func (h claimRefusals) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h claimRefusals) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h claimRefusals) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if args := cmd.Args(); len(args) > 1 && args[1] == h.sha {
			if c, ok := cmd.(*redis.Cmd); ok {
				if v, ok := c.Val().(int64); ok && v < 0 {
					select {
					case h.refused <- struct{}{}:
					default:
					}
				}
			}
		}
		return err
	}
}

// 1,000 concurrent duplicates of 100 requests: each request runs once,
// every caller gets its result (now or replayed) or an in-progress answer.
func TestThousandDuplicatesRunEachOnce(t *testing.T) {
	t.Parallel()
	b := barrier(t, store(t))
	ctx := t.Context()
	var runs [100]atomic.Int32
	var replays, inProgress atomic.Int32
	var wg sync.WaitGroup
	for i := range 1000 {
		wg.Go(func() {
			r := i % 100
			req := idempotency.Request{Key: fmt.Sprintf("req:%d", r), Fingerprint: idempotency.Fingerprint("payload", fmt.Sprint(r))}
			out, err := b.DoWait(ctx, req, 5*time.Second, func(context.Context, uint64) ([]byte, error) {
				runs[r].Add(1)
				time.Sleep(5 * time.Millisecond)
				return []byte(fmt.Sprint(r)), nil
			})
			switch {
			case errors.Is(err, idempotency.ErrInProgress):
				inProgress.Add(1)
			case assert.NoError(t, err):
				assert.Equal(t, fmt.Sprint(r), string(out.Result))
				if out.Replayed {
					replays.Add(1)
				}
			}
		})
	}
	wg.Wait()
	for r := range runs {
		assert.EqualValues(t, 1, runs[r].Load(), "request %d", r)
	}
	t.Logf("1000 calls of 100 requests: 100 runs, %d replays, %d still in progress at the deadline", replays.Load(), inProgress.Load())
}

func TestRejectsBadInput(t *testing.T) {
	_, err := idempotency.New(nil)
	assert.ErrorIs(t, err, redlease.ErrInvalid)
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	_, err = idempotency.New(c, idempotency.WithLease(time.Hour), idempotency.WithRetention(time.Minute))
	assert.ErrorIs(t, err, redlease.ErrInvalid)
	b := barrier(t, c)
	_, err = b.Do(t.Context(), idempotency.Request{}, func(context.Context, uint64) ([]byte, error) { return nil, nil })
	assert.ErrorIs(t, err, redlease.ErrInvalid)
	_, err = b.Do(t.Context(), idempotency.Request{Key: "k"}, nil)
	assert.ErrorIs(t, err, redlease.ErrInvalid)
}

// DoWait waits only for the Barrier's own "in progress". A handler that
// returns an in-progress error of its own (a downstream 409 mapped to
// ErrInProgress, a nested Barrier) has a result: a transient failure,
// released and returned at once, not waited on and run again.
func TestDoWaitReturnsAHandlersOwnInProgress(t *testing.T) {
	for _, c := range []struct {
		name string
		opts []idempotency.Option
	}{
		{"default", nil},
		{"WithStoreEverything", []idempotency.Option{idempotency.WithStoreEverything()}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := barrier(t, store(t), c.opts...)
			ctx := t.Context()
			req := idempotency.Request{Key: "nested"}
			var runs atomic.Int32
			downstream := &idempotency.InProgressError{RetryAfter: time.Second} // the ledger's 409
			probe := redistest.StartStallProbe(t)
			start := time.Now()
			_, err := b.DoWait(ctx, req, 2*time.Second, func(context.Context, uint64) ([]byte, error) {
				runs.Add(1)
				return nil, fmt.Errorf("ledger: %w", downstream)
			})
			elapsed := time.Since(start)
			assert.ErrorIs(t, err, idempotency.ErrInProgress, "the handler's error, returned to the caller")
			assert.EqualValues(t, 1, runs.Load(), "the handler ran once in one DoWait")
			assertWithin(t, probe, time.Second, start, elapsed, "not waited on")

			out, err := b.Do(ctx, req, result(&runs, "booked"))
			require.NoError(t, err, "released as a transient failure: the retry runs")
			assert.False(t, out.Replayed)
			assert.Equal(t, "booked", string(out.Result))
		})
	}
}
