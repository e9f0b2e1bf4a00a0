package idempotency_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/renew"
)

// A client that times out while the handler runs is the case
// Idempotency-Keys exist for. Its disconnect must not cancel the handler,
// whatever the handler would do on cancellation: the run completes, is
// recorded, and the retry gets its response; the charge happens once.
func TestHTTPClientTimeoutDoesNotDecideTheRecord(t *testing.T) {
	for _, tc := range []struct {
		name     string
		onCancel func(http.ResponseWriter) // what the handler does if its context ends
	}{
		{"handler that returns without writing", func(http.ResponseWriter) {}},
		{"handler that answers 503", func(w http.ResponseWriter) {
			http.Error(w, "cancelled", http.StatusServiceUnavailable)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wireNoLeaks(t)
			_, b := httpStore(t)
			var charges atomic.Int32
			release := newWireLatch()
			pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := charges.Add(1) // the effect: money moved
				release.wait(r.Context(), 10*time.Second)
				if r.Context().Err() != nil {
					tc.onCancel(w)
					return
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				_, _ = fmt.Fprintf(w, `{"charge":%d}`, n)
			})
			mw2, err := idempotency.Middleware(b, idempotency.WithGlobalKeys(), idempotency.WithInFlightWait(10*time.Second))
			require.NoError(t, err)
			mw := mw2(pay)

			// The first request's own context tells when the server saw its
			// client leave.
			var requests atomic.Int32
			gone := make(chan struct{})
			var goneOnce sync.Once
			ts := wireServe(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if requests.Add(1) == 1 {
					context.AfterFunc(r.Context(), func() { goneOnce.Do(func() { close(gone) }) })
				}
				mw.ServeHTTP(w, r)
			}))
			t.Cleanup(release.open)

			first := wirePost(t.Context(), wireClient(t, 200*time.Millisecond), ts.URL+"/pay", httpKey, `{"amount":100}`)
			var ne net.Error
			require.ErrorAs(t, first.err, &ne, "the impatient client gets no answer")
			require.True(t, ne.Timeout(), "%v", first.err)
			wireReceive(t, gone, 5*time.Second, "the server seeing the client leave")
			release.open() // the payment provider answers, after the client left

			retry := wirePost(t.Context(), wireClient(t, 15*time.Second), ts.URL+"/pay", httpKey, `{"amount":100}`)
			require.NoError(t, retry.err)
			assert.Equal(t, http.StatusCreated, retry.resp.StatusCode, "body: %s", retry.body)
			assert.Equal(t, `{"charge":1}`, string(retry.body), "the first run's response")
			assert.Equal(t, "true", retry.resp.Header.Get(idempotency.HeaderIdempotentReplayed))
			assert.EqualValues(t, 1, charges.Load(), "charged once")
		})
	}
}

// A run whose lock was lost is cancelled, and whatever the handler then
// answers is not the request's answer: it may have stopped before or after
// its effect. Nothing is recorded, its client gets 503 "outcome-unknown",
// and a retry runs the handler again.
func TestHTTPRunThatLostItsLockIsNotAnAnswer(t *testing.T) {
	wireNoLeaks(t)
	w, err := renew.New()
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	srv, b := httpStore(t, idempotency.WithLease(300*time.Millisecond), idempotency.WithKeeper(w))
	admin := srv.Client()

	var charges atomic.Int32
	entered := make(chan struct{}, 1)
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		if n == 1 {
			entered <- struct{}{}
			timer := time.NewTimer(10 * time.Second)
			defer timer.Stop()
			select {
			case <-r.Context().Done():
			case <-timer.C:
			}
			// A careless handler: it answers as if it were done.
			_, _ = w.Write([]byte("partial"))
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"charge":%d}`, n)
	})
	var mu sync.Mutex
	var logged []error
	mw, err := idempotency.Middleware(b, idempotency.WithGlobalKeys(),
		idempotency.WithInFlightWait(10*time.Second),
		idempotency.WithErrorLog(func(_ *http.Request, err error) {
			mu.Lock()
			defer mu.Unlock()
			logged = append(logged, err)
		}),
	)
	require.NoError(t, err)
	ts := wireServe(t, mw(pay))
	client := wireClient(t, 15*time.Second)

	firstDone := make(chan wireReply, 1)
	go func() { firstDone <- wirePost(t.Context(), client, ts.URL+"/pay", httpKey, "100") }()
	wireReceive(t, entered, 10*time.Second, "the first run")

	// Someone else holds the request's lock now: the Keeper's next renewal
	// finds it gone, and the run's context is cancelled.
	keys, err := admin.Keys(t.Context(), "idem:l:*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1, "the request's lock")
	require.NoError(t, admin.Set(t.Context(), keys[0], "someone-else", 300*time.Millisecond).Err())

	first := wireReceive(t, firstDone, 10*time.Second, "the first answer")
	require.NoError(t, first.err)
	requireProblem(t, http.StatusServiceUnavailable, first.resp.Header, first.body, first.resp.StatusCode, "outcome-unknown")
	assert.GreaterOrEqual(t, retryAfter(t, first.resp.Header), 1)
	assert.Empty(t, first.resp.Header.Get(idempotency.HeaderIdempotentReplayed))
	mu.Lock()
	if assert.Len(t, logged, 1) {
		assert.ErrorIs(t, logged[0], redlease.ErrLost)
	}
	mu.Unlock()

	// Nothing was recorded: the retry runs the handler again, once the
	// other holder's lock has expired.
	retry := wirePost(t.Context(), client, ts.URL+"/pay", httpKey, "100")
	require.NoError(t, retry.err)
	assert.Equal(t, http.StatusCreated, retry.resp.StatusCode, "body: %s", retry.body)
	assert.Equal(t, `{"charge":2}`, string(retry.body))
	assert.Empty(t, retry.resp.Header.Get(idempotency.HeaderIdempotentReplayed))
	assert.EqualValues(t, 2, charges.Load())
}
