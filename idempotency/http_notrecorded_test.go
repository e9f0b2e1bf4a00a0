package idempotency_test

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
)

// The store fails after the handler ran, for longer than the Barrier
// keeps trying (the request's lock): the client gets the handler's 201
// all the same (its effect happened), the error log gets ErrNotRecorded,
// and a retry, once the lock ran out, runs the handler again — what the
// Middleware documents, and why a handler's own storage should know the
// request.
func TestHTTPResponseNotRecordedIsSentAndReported(t *testing.T) {
	wireNoLeaks(t)
	srv, g, b := wireGatedStore(t, idempotency.WithLease(time.Second))
	var charges atomic.Int32
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
	ts := wireServe(t, mw(wireCharger(&charges)))
	client := wireClient(t, 20*time.Second)

	g.HoldRequests(wireReceipt)
	firstDone := make(chan wireReply, 1)
	go func() { firstDone <- wirePost(t.Context(), client, ts.URL+"/pay", httpKey, "100") }()
	require.NoError(t, g.WaitHeld(1, wireReceipt, 10*time.Second), "the handler ran and its response is on its way to the store")
	wireCrash(t, srv, g) // until after the lock ran out: the Barrier stops trying then
	first := wireReceive(t, firstDone, 15*time.Second, "the first answer")
	require.NoError(t, first.err)
	assert.Equal(t, http.StatusCreated, first.resp.StatusCode, "body: %s", first.body)
	assert.Contains(t, string(first.body), wireReceipt)
	assert.Empty(t, first.resp.Header.Get(idempotency.HeaderIdempotentReplayed))
	mu.Lock()
	if assert.Len(t, logged, 1) {
		assert.ErrorIs(t, logged[0], idempotency.ErrNotRecorded)
	}
	mu.Unlock()

	g.Heal() // the store is back with the in-progress record: nothing says the run completed
	retry := wirePost(t.Context(), client, ts.URL+"/pay", httpKey, "100")
	require.NoError(t, retry.err)
	assert.Equal(t, http.StatusCreated, retry.resp.StatusCode, "body: %s", retry.body)
	assert.Empty(t, retry.resp.Header.Get(idempotency.HeaderIdempotentReplayed), "the handler ran again")
	assert.EqualValues(t, 2, charges.Load())
}
