package idempotency_test

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
)

// wireReceipt marks a response body; the only request to the store that
// carries it is the one that records the response.
const wireReceipt = "receipt-5b1f0c"

// wireGatedStore starts a Redis behind a Gate, and a Barrier that reaches
// it only through the Gate. Tests take the store down by cutting the Gate
// (wireCrash), never by killing the server: a killed server frees its
// port, which another package's server running meanwhile can take, and
// the Barrier's reconnect would then reach that stranger; a cut Gate keeps
// its own port bound and refuses connections, and the server keeps its
// port.
//
// The client makes one try per call, with no retries and one dial: every
// retry through an outage is then the Barrier's own, which is what these
// tests are about. (go-redis's dial retries, five 100 ms apart, would
// otherwise carry a single call across a short cut.)
func wireGatedStore(t *testing.T, opts ...idempotency.Option) (*redistest.Server, *redistest.Gate, *idempotency.Barrier) {
	t.Helper()
	srv := redistest.Start(t, redistest.Config{})
	g := redistest.NewGate(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: g.Addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	b, err := idempotency.New(c, opts...)
	require.NoError(t, err)
	return srv, g, b
}

// wireCrash makes the store behind g look crashed to the Barrier until
// g.Heal: every connection through g is closed (chunks g held go nowhere)
// and new ones are refused, the Gate stops holding, and the server's
// script cache is flushed (directly, not through g), as a restart would
// lose it. The data stays, as with a durable store that comes back: that
// a restarted redis-server replays its append-only file is Redis's
// property, not the Barrier's, and these tests are about the Barrier.
func wireCrash(t *testing.T, srv *redistest.Server, g *redistest.Gate) {
	t.Helper()
	g.Cut()
	g.Open()
	require.NoError(t, srv.Client().ScriptFlush(t.Context()).Err())
}

// wireCharger is a handler that charges (counts its runs) and answers 201
// with a receipt (wireReceipt).
func wireCharger(charges *atomic.Int32) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = fmt.Fprintf(w, `{"charge":%d,"receipt":%q}`, n, wireReceipt)
	})
}

// The store blinks (crashes and comes back with its data: wireCrash, then
// Heal) after the handler ran and before its response is recorded. The
// client gets its 201, and its retry replays that 201 instead of charging
// again.
func TestHTTPStoreBlinkBeforeRecordIsSurvived(t *testing.T) {
	wireNoLeaks(t)
	srv, g, b := wireGatedStore(t, idempotency.WithLease(5*time.Second))
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
	wireCrash(t, srv, g) // the held recording is lost with its connection
	// The store is gone for a moment: until the first answer, or 500 ms.
	var first wireReply
	select {
	case first = <-firstDone:
	case <-time.After(500 * time.Millisecond):
	}
	g.Heal()
	if first.resp == nil && first.err == nil {
		first = wireReceive(t, firstDone, 15*time.Second, "the first answer")
	}

	require.NoError(t, first.err)
	assert.Equal(t, http.StatusCreated, first.resp.StatusCode, "body: %s", first.body)
	assert.Contains(t, string(first.body), wireReceipt)
	retry := wirePost(t.Context(), client, ts.URL+"/pay", httpKey, "100")
	require.NoError(t, retry.err)
	assert.Equal(t, http.StatusCreated, retry.resp.StatusCode, "body: %s", retry.body)
	assert.Equal(t, string(first.body), string(retry.body))
	assert.Equal(t, "true", retry.resp.Header.Get(idempotency.HeaderIdempotentReplayed), "replayed, not run again")
	assert.EqualValues(t, 1, charges.Load(), "charged once")
	mu.Lock()
	assert.Empty(t, logged, "nothing to report: the response was recorded")
	mu.Unlock()
}
