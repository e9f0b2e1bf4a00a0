package idempotency_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/renew"
)

// Helpers for tests on the wire: a real listener, real clients with their
// own timeouts, and no goroutine of ours left behind.

// wireNoLeaks checks, when the test ends, that it left no goroutine behind.
// Call it first, so that its check runs after every other cleanup.
func wireNoLeaks(t *testing.T) {
	t.Helper()
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) })
}

// serve runs h behind a real listener until the test ends (Close waits
// for the handlers still running).
func wireServe(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts
}

// wireClient is a real client with a transport of its own, which gives up
// on a request after timeout.
func wireClient(t *testing.T, timeout time.Duration) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: timeout}
}

// wireReply is what a client got: the response and its whole body, or the
// error that ended the exchange.
type wireReply struct {
	resp *http.Response
	body []byte
	err  error
}

// post sends a POST with an Idempotency-Key and reads the whole answer.
// Safe to call from any goroutine: it reports errors, it does not fail the
// test.
func wirePost(ctx context.Context, c *http.Client, url, key, body string) wireReply {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return wireReply{err: err}
	}
	req.Header.Set(idempotency.HeaderIdempotencyKey, key)
	resp, err := c.Do(req)
	if err != nil {
		return wireReply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return wireReply{resp: resp, body: b, err: err}
}

// wireLatch is a channel a test opens once to let handlers go on. Opening it
// again is harmless, so a cleanup opens it whatever happened, and no
// handler is left waiting when the server closes.
type wireLatch struct {
	ch   chan struct{}
	once sync.Once
}

// newWireLatch returns a latch, not open yet. Create it before the server
// whose handlers wait on it, and register its open as a cleanup after
// wireServe (t.Cleanup(l.open)), so that it runs before the server's Close.
func newWireLatch() *wireLatch { return &wireLatch{ch: make(chan struct{})} }

func (l *wireLatch) open() { l.once.Do(func() { close(l.ch) }) }

// wait waits until the latch is open, ctx ends or d passes, whichever is
// first, and reports whether the latch opened.
func (l *wireLatch) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.ch:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

// wireReceive waits for a value from ch, failing the test without it
// within d plus 3 × what a probe measured this process stalled meanwhile
// (redistest.Await).
func wireReceive[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	probe := redistest.StartStallProbe(t)
	defer probe.Stop()
	return redistest.Await(t, probe, ch, d, 3, "%s: nothing arrived", what)
}

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
	b := barrier(t, c, opts...)
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

// wireHeldCharge is a first payment whose response is held on its way to
// the store (see wireChargeHeld).
type wireHeldCharge struct {
	charges   atomic.Int32
	url       string // where payments go
	client    *http.Client
	firstDone chan wireReply // the first payment's answer
	mu        sync.Mutex
	errs      []error // the Middleware's error log
}

// logged returns what the Middleware logged so far.
func (h *wireHeldCharge) logged() []error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.errs)
}

// wireChargeHeld serves b's Middleware (global keys, an in-flight wait of
// 10 s, an error log) over wireCharger, sends a first payment, and waits
// until its handler ran and the recording of its response is held at g.
func wireChargeHeld(t *testing.T, b *idempotency.Barrier, g *redistest.Gate) *wireHeldCharge {
	t.Helper()
	h := &wireHeldCharge{firstDone: make(chan wireReply, 1)}
	mw, err := idempotency.Middleware(b, idempotency.WithGlobalKeys(),
		idempotency.WithInFlightWait(10*time.Second),
		idempotency.WithErrorLog(func(_ *http.Request, err error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.errs = append(h.errs, err)
		}),
	)
	require.NoError(t, err)
	h.url = wireServe(t, mw(wireCharger(&h.charges))).URL + "/pay"
	h.client = wireClient(t, 20*time.Second)

	g.HoldRequests(wireReceipt)
	go func() { h.firstDone <- wirePost(t.Context(), h.client, h.url, httpKey, "100") }()
	require.NoError(t, g.WaitHeld(1, wireReceipt, 10*time.Second), "the handler ran and its response is on its way to the store")
	return h
}

// The store blinks (crashes and comes back with its data: wireCrash, then
// Heal) after the handler ran and before its response is recorded. The
// client gets its 201, and its retry replays that 201 instead of charging
// again.
func TestHTTPStoreBlinkBeforeRecordIsSurvived(t *testing.T) {
	wireNoLeaks(t)
	srv, g, b := wireGatedStore(t, idempotency.WithLease(5*time.Second))
	h := wireChargeHeld(t, b, g)
	wireCrash(t, srv, g) // the held recording is lost with its connection
	// The store is gone for a moment: until the first answer, or 500 ms.
	var first wireReply
	select {
	case first = <-h.firstDone:
	case <-time.After(500 * time.Millisecond):
	}
	g.Heal()
	if first.resp == nil && first.err == nil {
		first = wireReceive(t, h.firstDone, 15*time.Second, "the first answer")
	}

	require.NoError(t, first.err)
	assert.Equal(t, http.StatusCreated, first.resp.StatusCode, "body: %s", first.body)
	assert.Contains(t, string(first.body), wireReceipt)
	retry := wirePost(t.Context(), h.client, h.url, httpKey, "100")
	require.NoError(t, retry.err)
	assert.Equal(t, http.StatusCreated, retry.resp.StatusCode, "body: %s", retry.body)
	assert.Equal(t, string(first.body), string(retry.body))
	assert.Equal(t, "true", retry.resp.Header.Get(idempotency.HeaderIdempotentReplayed), "replayed, not run again")
	assert.EqualValues(t, 1, h.charges.Load(), "charged once")
	assert.Empty(t, h.logged(), "nothing to report: the response was recorded")
}

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
			mw2 := httpMiddleware(t, b, idempotency.WithGlobalKeys(), idempotency.WithInFlightWait(10*time.Second))
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

// wireRelay is a payment API's handler: it forwards the request, with its
// Idempotency-Key, to a payment provider at url and relays the provider's
// status, Content-Type, Retry-After and body; 504 if the provider does not
// answer. Its first run gives up on the provider when giveUp is closed (its
// own outgoing timeout, forced). It counts its runs.
type wireRelay struct {
	url    string
	client *http.Client
	giveUp chan struct{}
	runs   atomic.Int32
}

func (a *wireRelay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := a.runs.Add(1)
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	if n == 1 {
		go func() {
			select {
			case <-a.giveUp:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	body, _ := io.ReadAll(r.Body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	req.Header.Set(idempotency.HeaderIdempotencyKey, r.Header.Get(idempotency.HeaderIdempotencyKey))
	resp, err := a.client.Do(req)
	if err != nil {
		http.Error(w, "payment provider did not answer", http.StatusGatewayTimeout)
		return
	}
	defer resp.Body.Close()
	for _, f := range []string{"Content-Type", "Retry-After"} {
		if v := resp.Header.Get(f); v != "" {
			w.Header().Set(f, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, resp.Body)
}

// A payment API behind the Middleware relays its payment provider's answer;
// the provider honours Idempotency-Key too (here: a Middleware of its own
// on the same Redis). The API's first run gives up on the provider while
// the provider is charging (504, not recorded); the client's retry reaches
// the provider while that charge is still in progress and relays its 409 +
// Retry-After. That 409 is not an outcome: once the charge is done, the
// client's next retry must run the API's handler again and get the charge,
// not a 409 replayed for the retention while the charge is never reported.
func TestHTTPDownstreamInProgressIsNotRecorded(t *testing.T) {
	wireNoLeaks(t)
	srv := redistest.Start(t, redistest.Config{})
	bAPI := barrier(t, srv.Client())
	bProv := barrier(t, srv.Client(), idempotency.WithPrefix("prov:"))

	// The provider: its first charge waits for the latch.
	var charges atomic.Int32
	started := make(chan struct{}, 1)
	latch := newWireLatch()
	charge := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1)
		select {
		case started <- struct{}{}:
		default:
		}
		if !latch.wait(r.Context(), 10*time.Second) {
			http.Error(w, "charge interrupted", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"charge":"ch_` + strconv.Itoa(int(n)) + `"}`))
	})
	provMW := httpMiddleware(t, bProv, idempotency.WithGlobalKeys())
	prov := wireServe(t, provMW(charge))
	// The same provider seen by the test, waiting for a charge in progress
	// to complete (the same records: same Barrier prefix, route and key).
	probeMW := httpMiddleware(t, bProv, idempotency.WithGlobalKeys(), idempotency.WithInFlightWait(10*time.Second))
	probe := wireServe(t, probeMW(charge))

	relay := &wireRelay{url: prov.URL + "/charges", client: wireClient(t, 20*time.Second), giveUp: make(chan struct{})}
	apiMW := httpMiddleware(t, bAPI, idempotency.WithGlobalKeys())
	api := wireServe(t, apiMW(relay))
	t.Cleanup(latch.open)
	client := wireClient(t, 20*time.Second)

	firstDone := make(chan wireReply, 1)
	go func() { firstDone <- wirePost(t.Context(), client, api.URL+"/pay", httpKey, "100") }()
	wireReceive(t, started, 10*time.Second, "the provider's charge started")
	close(relay.giveUp)
	first := wireReceive(t, firstDone, 10*time.Second, "the API's first answer")
	require.NoError(t, first.err)
	assert.Equal(t, http.StatusGatewayTimeout, first.resp.StatusCode, "body: %s", first.body)

	second := wirePost(t.Context(), client, api.URL+"/pay", httpKey, "100")
	require.NoError(t, second.err)
	require.Equal(t, http.StatusConflict, second.resp.StatusCode, "the provider's charge is in progress: body %s", second.body)
	assert.NotEmpty(t, second.resp.Header.Get("Retry-After"))
	assert.Contains(t, string(second.body), `"in-progress"`)

	latch.open()
	done := wirePost(t.Context(), client, probe.URL+"/charges", httpKey, "100")
	require.NoError(t, done.err)
	require.Equal(t, http.StatusCreated, done.resp.StatusCode, "the provider's charge completed: body %s", done.body)
	assert.Equal(t, "true", done.resp.Header.Get(idempotency.HeaderIdempotentReplayed))

	third := wirePost(t.Context(), client, api.URL+"/pay", httpKey, "100")
	require.NoError(t, third.err)
	assert.Equal(t, http.StatusCreated, third.resp.StatusCode, "the retry learns of the charge: body %s", third.body)
	assert.Equal(t, `{"charge":"ch_1"}`, string(third.body))
	assert.Empty(t, third.resp.Header.Get(idempotency.HeaderIdempotentReplayed), "the API's handler ran again")

	fourth := wirePost(t.Context(), client, api.URL+"/pay", httpKey, "100")
	require.NoError(t, fourth.err)
	assert.Equal(t, http.StatusCreated, fourth.resp.StatusCode)
	assert.Equal(t, `{"charge":"ch_1"}`, string(fourth.body))
	assert.Equal(t, "true", fourth.resp.Header.Get(idempotency.HeaderIdempotentReplayed), "then the charge is replayed")

	assert.EqualValues(t, 1, charges.Load(), "one charge at the provider")
	assert.EqualValues(t, 3, relay.runs.Load())
}

// Every 409 a handler answers is sent but not recorded, with or without
// Retry-After, whatever WithTransientStatuses lists and whatever the
// Barrier's WithStoreEverything says: the retry runs the handler.
func TestHTTPConflictIsNeverRecorded(t *testing.T) {
	for _, tc := range []struct {
		name       string
		retryAfter string
		barrier    []idempotency.Option
		opts       []idempotency.HTTPOption
	}{
		{"with Retry-After", "3", nil, nil},
		{"without Retry-After", "", nil, nil},
		{"no transient statuses", "3", nil, []idempotency.HTTPOption{idempotency.WithTransientStatuses()}},
		{"transient 429 only, server errors stored", "", nil, []idempotency.HTTPOption{
			idempotency.WithTransientStatuses(http.StatusTooManyRequests), idempotency.WithStoreServerErrors(true)}},
		{"Barrier stores everything", "", []idempotency.Option{idempotency.WithStoreEverything()}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wireNoLeaks(t)
			_, b := httpStore(t, tc.barrier...)
			a := &wireAnswers{statuses: []int{http.StatusConflict, http.StatusCreated}, retryAfter: tc.retryAfter}
			mw := httpMiddleware(t, b, append([]idempotency.HTTPOption{idempotency.WithGlobalKeys()}, tc.opts...)...)
			ts := wireServe(t, mw(a))

			got := wireExchanges(t, ts.URL+"/pay", 3)
			assert.Equal(t, http.StatusConflict, got[0].resp.StatusCode)
			assert.Equal(t, tc.retryAfter, got[0].resp.Header.Get("Retry-After"))
			assert.Equal(t, "run 1: 409", string(got[0].body))
			assert.Equal(t, http.StatusCreated, got[1].resp.StatusCode, "the retry runs: body %s", got[1].body)
			assert.Empty(t, got[1].resp.Header.Get(idempotency.HeaderIdempotentReplayed))
			assert.Equal(t, "run 2: 201", string(got[2].body), "then the 201 is replayed")
			assert.Equal(t, "true", got[2].resp.Header.Get(idempotency.HeaderIdempotentReplayed))
			assert.EqualValues(t, 2, a.runs.Load())
		})
	}
}

// A replayed body travels with its representation fields (Content-Type,
// Content-Encoding, Content-Language), whatever WithReplayHeaders says:
// a gzip body replayed without its Content-Encoding is garbage to its
// client. A standard client decodes the replay as it decoded the first.
func TestHTTPReplayKeepsRepresentationFields(t *testing.T) {
	const doc = `{"id":1,"note":"Zahlung angenommen"}`
	for _, tc := range []struct {
		name string
		opts []idempotency.HTTPOption
	}{
		{"default replay headers", nil},
		{"Location only", []idempotency.HTTPOption{idempotency.WithReplayHeaders("Location")}},
		{"none", []idempotency.HTTPOption{idempotency.WithReplayHeaders()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wireNoLeaks(t)
			_, b := httpStore(t)
			var runs atomic.Int32
			gzipped := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				runs.Add(1)
				var buf bytes.Buffer
				zw := gzip.NewWriter(&buf)
				_, _ = zw.Write([]byte(doc))
				_ = zw.Close()
				h := w.Header()
				h.Set("Content-Type", "application/json")
				h.Set("Content-Encoding", "gzip")
				h.Set("Content-Language", "de")
				h.Set("Vary", "Accept-Encoding")
				w.WriteHeader(http.StatusCreated)
				_, _ = w.Write(buf.Bytes())
			})
			mw := httpMiddleware(t, b, append([]idempotency.HTTPOption{idempotency.WithGlobalKeys()}, tc.opts...)...)
			ts := wireServe(t, mw(gzipped))
			client := wireClient(t, 10*time.Second) // asks for gzip, and decodes it

			for i, want := range []string{"", "true"} {
				got := wirePost(t.Context(), client, ts.URL+"/pay", httpKey, "100")
				require.NoError(t, got.err)
				assert.Equal(t, http.StatusCreated, got.resp.StatusCode)
				assert.Equal(t, want, got.resp.Header.Get(idempotency.HeaderIdempotentReplayed), "exchange %d", i+1)
				assert.True(t, got.resp.Uncompressed, "exchange %d: the client decoded a gzip body", i+1)
				assert.Equal(t, doc, string(got.body), "exchange %d", i+1)
				assert.Equal(t, "application/json", got.resp.Header.Get("Content-Type"), "exchange %d", i+1)
				assert.Equal(t, "de", got.resp.Header.Get("Content-Language"), "exchange %d", i+1)
			}
			assert.EqualValues(t, 1, runs.Load())
		})
	}
}

// The store fails after the handler ran, for longer than the Barrier
// keeps trying (the request's lock): the client gets the handler's 201
// all the same (its effect happened), the error log gets ErrNotRecorded,
// and a retry, once the lock ran out, runs the handler again — what the
// Middleware documents, and why a handler's own storage should know the
// request.
func TestHTTPResponseNotRecordedIsSentAndReported(t *testing.T) {
	wireNoLeaks(t)
	srv, g, b := wireGatedStore(t, idempotency.WithLease(time.Second))
	h := wireChargeHeld(t, b, g)
	wireCrash(t, srv, g) // until after the lock ran out: the Barrier stops trying then
	first := wireReceive(t, h.firstDone, 15*time.Second, "the first answer")
	require.NoError(t, first.err)
	assert.Equal(t, http.StatusCreated, first.resp.StatusCode, "body: %s", first.body)
	assert.Contains(t, string(first.body), wireReceipt)
	assert.Empty(t, first.resp.Header.Get(idempotency.HeaderIdempotentReplayed))
	if logged := h.logged(); assert.Len(t, logged, 1) {
		assert.ErrorIs(t, logged[0], idempotency.ErrNotRecorded)
	}

	g.Heal() // the store is back with the in-progress record: nothing says the run completed
	retry := wirePost(t.Context(), h.client, h.url, httpKey, "100")
	require.NoError(t, retry.err)
	assert.Equal(t, http.StatusCreated, retry.resp.StatusCode, "body: %s", retry.body)
	assert.Empty(t, retry.resp.Header.Get(idempotency.HeaderIdempotentReplayed), "the handler ran again")
	assert.EqualValues(t, 2, h.charges.Load())
}

// A Barrier with WithStoreEverything does not change what the Middleware
// records: a status the Middleware documents as not recorded (a transient
// status, a 5xx without WithStoreServerErrors, a 5xx listed in
// WithTransientStatuses even with it) reaches its client, the key is
// released, and the retry runs the handler; never a "stored-failure"
// replayed for the retention.
func TestHTTPStoreEverythingKeepsUnrecordedStatusesUnrecorded(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		opts   []idempotency.HTTPOption
	}{
		{"429 default", http.StatusTooManyRequests, nil},
		{"408 default", http.StatusRequestTimeout, nil},
		{"425 default", http.StatusTooEarly, nil},
		{"502 default", http.StatusBadGateway, nil},
		{"503 listed, server errors stored", http.StatusServiceUnavailable, []idempotency.HTTPOption{
			idempotency.WithTransientStatuses(http.StatusServiceUnavailable), idempotency.WithStoreServerErrors(true)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wireNoLeaks(t)
			_, b := httpStore(t, idempotency.WithStoreEverything())
			a := &wireAnswers{statuses: []int{tc.status, http.StatusCreated}, retryAfter: "2"}
			mw := httpMiddleware(t, b, append([]idempotency.HTTPOption{idempotency.WithGlobalKeys()}, tc.opts...)...)
			ts := wireServe(t, mw(a))

			got := wireExchanges(t, ts.URL+"/pay", 3)
			assert.Equal(t, tc.status, got[0].resp.StatusCode)
			assert.Equal(t, "2", got[0].resp.Header.Get("Retry-After"))
			assert.Equal(t, fmt.Sprintf("run 1: %d", tc.status), string(got[0].body))
			assert.Equal(t, http.StatusCreated, got[1].resp.StatusCode, "the retry runs: body %s", got[1].body)
			assert.Equal(t, "run 2: 201", string(got[1].body))
			assert.Empty(t, got[1].resp.Header.Get(idempotency.HeaderIdempotentReplayed))
			assert.Equal(t, "run 2: 201", string(got[2].body), "then the 201 is replayed")
			assert.Equal(t, "true", got[2].resp.Header.Get(idempotency.HeaderIdempotentReplayed))
			assert.EqualValues(t, 2, a.runs.Load())
		})
	}
}

// With WithStoreServerErrors, a Barrier with WithStoreEverything records a
// 5xx as the response it is (its status, fields and body), as without it:
// not as a "stored-failure".
func TestHTTPStoreEverythingRecordsStoredServerErrorsAsResponses(t *testing.T) {
	wireNoLeaks(t)
	_, b := httpStore(t, idempotency.WithStoreEverything())
	a := &wireAnswers{statuses: []int{http.StatusInternalServerError, http.StatusCreated}}
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys(), idempotency.WithStoreServerErrors(true))
	ts := wireServe(t, mw(a))

	got := wireExchanges(t, ts.URL+"/pay", 2)
	assert.Equal(t, http.StatusInternalServerError, got[1].resp.StatusCode)
	assert.Equal(t, "run 1: 500", string(got[1].body))
	assert.Equal(t, "true", got[1].resp.Header.Get(idempotency.HeaderIdempotentReplayed))
	assert.EqualValues(t, 1, a.runs.Load())
}

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
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys())
	ts := wireServe(t, mw(wireStuckThenOK(&charges, seen)))

	first := wirePost(t.Context(), wireClient(t, 15*time.Second), ts.URL+"/pay", httpKey, "100")
	require.NoError(t, first.err)
	requireProblem(t, http.StatusServiceUnavailable, first.resp.Header, first.body, first.resp.StatusCode, "outcome-unknown")
	run := wireReceive(t, seen, time.Second, "the first run")
	assert.ErrorIs(t, run.err, context.DeadlineExceeded, "the deadline ended the run")
	assert.False(t, run.lost, "the lock was still held")
}

// wireAnswers is a handler whose n-th run answers statuses[n-1] (the last one
// from then on), with retryAfter as Retry-After on anything but a 2xx (if
// set), and a body that names the run. It counts its runs.
type wireAnswers struct {
	statuses   []int
	retryAfter string
	runs       atomic.Int32
}

func (a *wireAnswers) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := int(a.runs.Add(1))
	status := a.statuses[min(n, len(a.statuses))-1]
	if a.retryAfter != "" && (status < 200 || status >= 300) {
		w.Header().Set("Retry-After", a.retryAfter)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = fmt.Fprintf(w, "run %d: %d", n, status)
}

// wireExchanges sends the same keyed request n times, one after the other.
func wireExchanges(t *testing.T, url string, n int) []wireReply {
	t.Helper()
	client := wireClient(t, 10*time.Second)
	out := make([]wireReply, n)
	for i := range out {
		out[i] = wirePost(t.Context(), client, url, httpKey, "100")
		require.NoError(t, out[i].err, "exchange %d", i+1)
	}
	return out
}

// A 408, 425 or 429 says "not now", not "no": it reaches its client with
// its Retry-After, is not recorded, and the retry runs the handler.
func TestHTTPTransientStatusesAreNotRecorded(t *testing.T) {
	for _, status := range []int{http.StatusRequestTimeout, http.StatusTooEarly, http.StatusTooManyRequests} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			wireNoLeaks(t)
			_, b := httpStore(t)
			a := &wireAnswers{statuses: []int{status, http.StatusCreated}, retryAfter: "2"}
			mw := httpMiddleware(t, b, idempotency.WithGlobalKeys())
			ts := wireServe(t, mw(a))

			got := wireExchanges(t, ts.URL+"/pay", 3)
			assert.Equal(t, status, got[0].resp.StatusCode)
			assert.Equal(t, "2", got[0].resp.Header.Get("Retry-After"))
			assert.Empty(t, got[0].resp.Header.Get(idempotency.HeaderIdempotentReplayed))
			assert.Equal(t, http.StatusCreated, got[1].resp.StatusCode, "the retry runs: body %s", got[1].body)
			assert.Equal(t, "run 2: 201", string(got[1].body))
			assert.Empty(t, got[1].resp.Header.Get(idempotency.HeaderIdempotentReplayed))
			assert.Equal(t, "run 2: 201", string(got[2].body), "then the 201 is replayed")
			assert.Equal(t, "true", got[2].resp.Header.Get(idempotency.HeaderIdempotentReplayed))
			assert.EqualValues(t, 2, a.runs.Load())
		})
	}
}

// A recorded response that carries Retry-After is replayed with it,
// whatever WithReplayHeaders says.
func TestHTTPRetryAfterIsRecorded(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		opts   []idempotency.HTTPOption
	}{
		{"202 accepted", http.StatusAccepted, nil},
		{"422 unprocessable, no replay headers", http.StatusUnprocessableEntity, []idempotency.HTTPOption{idempotency.WithReplayHeaders()}},
		{"503 with WithStoreServerErrors", http.StatusServiceUnavailable, []idempotency.HTTPOption{idempotency.WithStoreServerErrors(true)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wireNoLeaks(t)
			_, b := httpStore(t)
			a := &wireAnswers{statuses: []int{tc.status}}
			mw := httpMiddleware(t, b, append([]idempotency.HTTPOption{idempotency.WithGlobalKeys()}, tc.opts...)...)
			ts := wireServe(t, mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "5") // a 202 says when to look
				a.ServeHTTP(w, r)
			})))

			got := wireExchanges(t, ts.URL+"/jobs", 2)
			assert.Equal(t, tc.status, got[1].resp.StatusCode)
			assert.Equal(t, string(got[0].body), string(got[1].body))
			assert.Equal(t, "true", got[1].resp.Header.Get(idempotency.HeaderIdempotentReplayed))
			assert.Equal(t, "5", got[0].resp.Header.Get("Retry-After"))
			assert.Equal(t, "5", got[1].resp.Header.Get("Retry-After"))
			assert.EqualValues(t, 1, a.runs.Load())
		})
	}
}

// WithTransientStatuses replaces the default set: what it lists is not
// recorded (5xx included, even with WithStoreServerErrors), everything
// else a recorded status would be is recorded and replayed, Retry-After
// and all. A 409 is not recorded whatever the set.
func TestHTTPTransientStatusesOption(t *testing.T) {
	sets := map[string][]idempotency.HTTPOption{
		"default": nil,
		"409,503": {idempotency.WithTransientStatuses(http.StatusConflict, http.StatusServiceUnavailable), idempotency.WithStoreServerErrors(true)},
		"none":    {idempotency.WithTransientStatuses()},
	}
	for _, tc := range []struct {
		set      string
		status   int
		recorded bool
	}{
		{"409,503", http.StatusConflict, false},
		{"409,503", http.StatusServiceUnavailable, false},
		{"409,503", http.StatusTooManyRequests, true},
		{"409,503", http.StatusInternalServerError, true},
		{"none", http.StatusTooManyRequests, true},
		{"none", http.StatusRequestTimeout, true},
		{"default", http.StatusTooManyRequests, false},
		{"default", http.StatusConflict, false},
		{"none", http.StatusConflict, false},
		{"default", http.StatusUnprocessableEntity, true},
	} {
		t.Run(fmt.Sprintf("set=%s/status=%d", tc.set, tc.status), func(t *testing.T) {
			wireNoLeaks(t)
			_, b := httpStore(t)
			a := &wireAnswers{statuses: []int{tc.status, http.StatusCreated}, retryAfter: "3"}
			mw := httpMiddleware(t, b, append([]idempotency.HTTPOption{idempotency.WithGlobalKeys()}, sets[tc.set]...)...)
			ts := wireServe(t, mw(a))

			got := wireExchanges(t, ts.URL+"/pay", 2)
			assert.Equal(t, tc.status, got[0].resp.StatusCode)
			if tc.recorded {
				assert.Equal(t, tc.status, got[1].resp.StatusCode)
				assert.Equal(t, string(got[0].body), string(got[1].body))
				assert.Equal(t, "3", got[1].resp.Header.Get("Retry-After"))
				assert.Equal(t, "true", got[1].resp.Header.Get(idempotency.HeaderIdempotentReplayed))
				assert.EqualValues(t, 1, a.runs.Load())
			} else {
				assert.Equal(t, http.StatusCreated, got[1].resp.StatusCode, "the retry runs")
				assert.Empty(t, got[1].resp.Header.Get(idempotency.HeaderIdempotentReplayed))
				assert.EqualValues(t, 2, a.runs.Load())
			}
		})
	}
}

const varyDoc = `{"id":1,"note":"payment accepted"}`

// wireNegotiator is a handler that negotiates its response: gzip if the
// request accepts it, a Content-Language from Accept-Language ("de" if
// the request asks for it first, else "en"), and vary as its Vary field
// lines. It counts its runs.
type wireNegotiator struct {
	vary []string
	runs atomic.Int32
}

func (n *wireNegotiator) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n.runs.Add(1)
	h := w.Header()
	for _, v := range n.vary {
		h.Add("Vary", v)
	}
	h.Set("Content-Type", "application/json")
	h.Set("Content-Language", "en")
	if strings.HasPrefix(r.Header.Get("Accept-Language"), "de") {
		h.Set("Content-Language", "de")
	}
	body := []byte(varyDoc)
	if strings.Contains(strings.Join(r.Header.Values("Accept-Encoding"), ","), "gzip") {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write(body)
		_ = zw.Close()
		body = buf.Bytes()
		h.Set("Content-Encoding", "gzip")
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}

// wireRawClient is a client that sends the header fields it is given and
// no others of its own (no Accept-Encoding), and does not decode bodies.
func wireRawClient(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

// wirePostWith is wirePost with header fields of the caller's: each entry's
// values become field lines, an empty slice a field line with an empty
// value.
func wirePostWith(ctx context.Context, c *http.Client, url, key, body string, fields map[string][]string) wireReply {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return wireReply{err: err}
	}
	req.Header.Set(idempotency.HeaderIdempotencyKey, key)
	for name, values := range fields {
		if len(values) == 0 {
			req.Header[http.CanonicalHeaderKey(name)] = []string{""}
		}
		for _, v := range values {
			req.Header.Add(name, v)
		}
	}
	resp, err := c.Do(req)
	if err != nil {
		return wireReply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return wireReply{resp: resp, body: b, err: err}
}

// A duplicate whose request differs from the first in a header field the
// recorded response's Vary names must not get bytes negotiated for the
// first request (gzip to a client that did not ask for it, German to one
// that asked for English): it gets 409 "negotiation-mismatch", marked
// replayed, without Retry-After, and the handler does not run again. A
// duplicate with the first request's values (however split into field
// lines) gets the replay.
func TestHTTPReplayHonoursVary(t *testing.T) {
	gzipped := map[string][]string{"Accept-Encoding": {"gzip"}}
	for _, tc := range []struct {
		name     string
		vary     []string
		first    map[string][]string
		dup      map[string][]string
		replayed bool
	}{
		{"gzip first, none asked then", []string{"Accept-Encoding"}, gzipped, nil, false},
		{"gzip first, identity asked then", []string{"Accept-Encoding"}, gzipped, map[string][]string{"Accept-Encoding": {"identity"}}, false},
		{"gzip first, empty field then", []string{"Accept-Encoding"}, gzipped, map[string][]string{"Accept-Encoding": {}}, false},
		{"none first, gzip asked then", []string{"Accept-Encoding"}, nil, gzipped, false},
		{"two names in lower case, language differs", []string{"accept-encoding, accept-language"},
			map[string][]string{"Accept-Encoding": {"gzip"}, "Accept-Language": {"de"}},
			map[string][]string{"Accept-Encoding": {"gzip"}, "Accept-Language": {"en"}}, false},
		{"two field lines, language differs", []string{"Accept-Encoding", "Accept-Language"},
			map[string][]string{"Accept-Language": {"de"}}, map[string][]string{"Accept-Language": {"en"}}, false},
		{"same values", []string{"Accept-Encoding, Accept-Language"},
			map[string][]string{"Accept-Encoding": {"gzip"}, "Accept-Language": {"de"}},
			map[string][]string{"Accept-Encoding": {"gzip"}, "Accept-Language": {"de"}}, true},
		{"same values, other field lines", []string{"Accept-Encoding"},
			map[string][]string{"Accept-Encoding": {"gzip, br"}}, map[string][]string{"Accept-Encoding": {"gzip", "br"}}, true},
		{"a field Vary does not name differs", []string{"Accept-Encoding"},
			map[string][]string{"Accept-Encoding": {"gzip"}, "Accept-Language": {"de"}}, gzipped, true},
		{"no Vary", nil, gzipped, nil, true},
		{"Vary *", []string{"*"}, gzipped, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wireNoLeaks(t)
			_, b := httpStore(t)
			n := &wireNegotiator{vary: tc.vary}
			mw := httpMiddleware(t, b, idempotency.WithGlobalKeys())
			ts := wireServe(t, mw(n))
			client := wireRawClient(t)

			first := wirePostWith(t.Context(), client, ts.URL+"/pay", httpKey, "100", tc.first)
			require.NoError(t, first.err)
			require.Equal(t, http.StatusCreated, first.resp.StatusCode, "body: %s", first.body)
			dup := wirePostWith(t.Context(), client, ts.URL+"/pay", httpKey, "100", tc.dup)
			require.NoError(t, dup.err)
			assert.Equal(t, "true", dup.resp.Header.Get(idempotency.HeaderIdempotentReplayed))
			if tc.replayed {
				assert.Equal(t, http.StatusCreated, dup.resp.StatusCode, "body: %s", dup.body)
				assert.Equal(t, first.body, dup.body)
				assert.Equal(t, first.resp.Header.Get("Content-Encoding"), dup.resp.Header.Get("Content-Encoding"))
				assert.Equal(t, first.resp.Header.Values("Vary"), dup.resp.Header.Values("Vary"), "Vary is replayed")
			} else {
				requireProblem(t, http.StatusConflict, dup.resp.Header, dup.body, dup.resp.StatusCode, "negotiation-mismatch")
				assert.Empty(t, dup.resp.Header.Get("Retry-After"), "retrying the same request will not help")
				assert.Empty(t, dup.resp.Header.Get("Content-Encoding"))
				// The first request's header fields still get the replay.
				again := wirePostWith(t.Context(), client, ts.URL+"/pay", httpKey, "100", tc.first)
				require.NoError(t, again.err)
				assert.Equal(t, http.StatusCreated, again.resp.StatusCode, "body: %s", again.body)
				assert.Equal(t, first.body, again.body)
				assert.Equal(t, "true", again.resp.Header.Get(idempotency.HeaderIdempotentReplayed))
			}
			assert.EqualValues(t, 1, n.runs.Load(), "the handler ran once")
		})
	}
}
