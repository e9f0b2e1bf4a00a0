package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
)

// wireRunSeen is what the first run of a handler saw of its context.
type wireRunSeen struct {
	err  error // ctx.Err() once it ended
	lost bool  // its cause says the lock was lost
}

// wireStuckThenOK is a handler whose first run waits for its context to end
// (at most 10 s) and then answers a careless 200, as if it were done; its
// later runs answer 201 at once. It counts its runs (the charges).
func wireStuckThenOK(charges *atomic.Int32, seen chan<- wireRunSeen) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		if n == 1 {
			timer := time.NewTimer(10 * time.Second)
			defer timer.Stop()
			select {
			case <-r.Context().Done():
			case <-timer.C:
			}
			seen <- wireRunSeen{err: r.Context().Err(), lost: errors.Is(context.Cause(r.Context()), redlease.ErrLost)}
			_, _ = w.Write([]byte("partial"))
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"charge":%d}`, n)
	})
}

// A run that outlives WithHandlerTimeout is cancelled: what it answers
// then is not recorded, not sent; its client gets 503 "outcome-unknown",
// the error log ErrRunCancelled, and a retry runs the handler again.
func TestHTTPHandlerTimeoutAnswersOutcomeUnknown(t *testing.T) {
	wireNoLeaks(t)
	_, b := httpStore(t)
	var charges atomic.Int32
	seen := make(chan wireRunSeen, 1)
	var mu sync.Mutex
	var logged []error
	mw, err := idempotency.Middleware(b, idempotency.WithGlobalKeys(),
		idempotency.WithHandlerTimeout(200*time.Millisecond),
		idempotency.WithErrorLog(func(_ *http.Request, err error) {
			mu.Lock()
			defer mu.Unlock()
			logged = append(logged, err)
		}),
	)
	require.NoError(t, err)
	ts := wireServe(t, mw(wireStuckThenOK(&charges, seen)))
	client := wireClient(t, 15*time.Second)

	first := wirePost(t.Context(), client, ts.URL+"/pay", httpKey, "100")
	require.NoError(t, first.err)
	requireProblem(t, http.StatusServiceUnavailable, first.resp.Header, first.body, first.resp.StatusCode, "outcome-unknown")
	assert.GreaterOrEqual(t, retryAfter(t, first.resp.Header), 1)
	assert.Empty(t, first.resp.Header.Get(idempotency.HeaderIdempotentReplayed))
	run := wireReceive(t, seen, time.Second, "the first run")
	assert.ErrorIs(t, run.err, context.DeadlineExceeded)
	assert.False(t, run.lost)
	mu.Lock()
	if assert.Len(t, logged, 1) {
		assert.ErrorIs(t, logged[0], idempotency.ErrRunCancelled)
	}
	mu.Unlock()

	retry := wirePost(t.Context(), client, ts.URL+"/pay", httpKey, "100")
	require.NoError(t, retry.err)
	assert.Equal(t, http.StatusCreated, retry.resp.StatusCode, "body: %s", retry.body)
	assert.Equal(t, `{"charge":2}`, string(retry.body), "nothing was recorded: the retry ran")
	again := wirePost(t.Context(), client, ts.URL+"/pay", httpKey, "100")
	require.NoError(t, again.err)
	assert.Equal(t, `{"charge":2}`, string(again.body))
	assert.Equal(t, "true", again.resp.Header.Get(idempotency.HeaderIdempotentReplayed))
	assert.EqualValues(t, 2, charges.Load())
}

// By default, on a Barrier without a Keeper, a run ends at two thirds of
// the lease: by the middleware's deadline, while the lock is still held,
// not by the lock's loss.
func TestHTTPDefaultHandlerTimeoutEndsRunBeforeItsLock(t *testing.T) {
	wireNoLeaks(t)
	const lease = 900 * time.Millisecond
	_, b := httpStore(t, idempotency.WithLease(lease))
	var charges atomic.Int32
	seen := make(chan wireRunSeen, 1)
	mw, err := idempotency.Middleware(b, idempotency.WithGlobalKeys())
	require.NoError(t, err)
	ts := wireServe(t, mw(wireStuckThenOK(&charges, seen)))

	first := wirePost(t.Context(), wireClient(t, 15*time.Second), ts.URL+"/pay", httpKey, "100")
	require.NoError(t, first.err)
	requireProblem(t, http.StatusServiceUnavailable, first.resp.Header, first.body, first.resp.StatusCode, "outcome-unknown")
	run := wireReceive(t, seen, time.Second, "the first run")
	assert.ErrorIs(t, run.err, context.DeadlineExceeded, "the deadline ended the run")
	assert.False(t, run.lost, "the lock was still held")
}
