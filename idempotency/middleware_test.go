package idempotency_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
)

const httpKey = `"8e03978e-40d5-43e8-bc93-6894a57f9324"`

// httpStore starts a real Redis and a Barrier on it.
func httpStore(t *testing.T, opts ...idempotency.Option) (*redistest.Server, *idempotency.Barrier) {
	t.Helper()
	srv := redistest.Start(t, redistest.Config{})
	return srv, barrier(t, srv.Client(), opts...)
}

// httpMiddleware is idempotency.Middleware(b, opts...); an error fails t.
func httpMiddleware(t *testing.T, b *idempotency.Barrier, opts ...idempotency.HTTPOption) func(http.Handler) http.Handler {
	t.Helper()
	mw, err := idempotency.Middleware(b, opts...)
	require.NoError(t, err)
	return mw
}

// orders is a handler that creates an order per call: it counts its calls,
// echoes the body it got, and sets a replayed and a non-replayed field.
type orders struct{ calls atomic.Int32 }

func (o *orders) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := o.calls.Add(1)
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", fmt.Sprintf("/orders/%d", n))
	w.Header().Set("X-Request-Id", strconv.Itoa(int(n)))
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"id":%d,"echo":%q}`, n, body)
}

func keyed(method, target, key, body string) *http.Request {
	r := httptest.NewRequest(method, target, strings.NewReader(body))
	if key != "" {
		r.Header.Set(idempotency.HeaderIdempotencyKey, key)
	}
	return r
}

func serveHTTP(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

type problemDoc struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

// requireProblem checks an RFC 9457 problem response and returns it.
func requireProblem(t *testing.T, status int, h http.Header, body []byte, gotStatus int, code string) problemDoc {
	t.Helper()
	require.Equal(t, status, gotStatus, "body: %s", body)
	assert.Equal(t, "application/problem+json", h.Get("Content-Type"))
	var p problemDoc
	require.NoError(t, json.Unmarshal(body, &p), "body: %s", body)
	assert.Equal(t, "about:blank", p.Type)
	assert.Equal(t, status, p.Status)
	assert.NotEmpty(t, p.Title)
	assert.NotEmpty(t, p.Detail)
	assert.Equal(t, code, p.Code)
	return p
}

func requireRecProblem(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) problemDoc {
	t.Helper()
	return requireProblem(t, status, rec.Header(), rec.Body.Bytes(), rec.Code, code)
}

func retryAfter(t *testing.T, h http.Header) int {
	t.Helper()
	n, err := strconv.Atoi(h.Get("Retry-After"))
	require.NoError(t, err, "Retry-After %q", h.Get("Retry-After"))
	return n
}

func TestHTTPFirstRunsDuplicateReplays(t *testing.T) {
	_, b := httpStore(t)
	o := &orders{}
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys())
	h := mw(o)

	first := serveHTTP(h, keyed("POST", "/orders", httpKey, `{"sku":"a"}`))
	require.Equal(t, http.StatusCreated, first.Code)
	assert.Equal(t, `{"id":1,"echo":"{\"sku\":\"a\"}"}`, first.Body.String(), "the handler got the body intact")
	assert.Equal(t, "1", first.Header().Get("X-Request-Id"), "the first client gets every field")
	assert.Empty(t, first.Header().Get(idempotency.HeaderIdempotentReplayed))

	for range 3 {
		dup := serveHTTP(h, keyed("POST", "/orders", httpKey, `{"sku":"a"}`))
		assert.Equal(t, http.StatusCreated, dup.Code)
		assert.Equal(t, first.Body.String(), dup.Body.String())
		assert.Equal(t, "application/json", dup.Header().Get("Content-Type"))
		assert.Equal(t, "/orders/1", dup.Header().Get("Location"))
		assert.Empty(t, dup.Header().Get("X-Request-Id"), "only the replay fields are recorded")
		assert.Equal(t, "true", dup.Header().Get(idempotency.HeaderIdempotentReplayed))
	}
	assert.EqualValues(t, 1, o.calls.Load())

	// The same key on another route is another request.
	other := serveHTTP(h, keyed("POST", "/refunds", httpKey, `{"sku":"a"}`))
	assert.Equal(t, http.StatusCreated, other.Code)
	assert.EqualValues(t, 2, o.calls.Load())
}

func TestHTTPUnquotedKeyIsTheSameKey(t *testing.T) {
	_, b := httpStore(t)
	o := &orders{}
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys())
	h := mw(o)
	serveHTTP(h, keyed("POST", "/orders", httpKey, "x"))
	dup := serveHTTP(h, keyed("POST", "/orders", strings.Trim(httpKey, `"`), "x"))
	assert.Equal(t, "true", dup.Header().Get(idempotency.HeaderIdempotentReplayed))
	assert.EqualValues(t, 1, o.calls.Load())
}

func TestHTTPConcurrentDuplicateGets409(t *testing.T) {
	_, b := httpStore(t)
	var calls atomic.Int32
	entered, release := make(chan struct{}, 1), make(chan struct{})
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys())
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		entered <- struct{}{}
		<-release
		w.WriteHeader(http.StatusAccepted)
	}))

	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- serveHTTP(h, keyed("POST", "/pay", httpKey, "100")) }()
	<-entered

	dup := serveHTTP(h, keyed("POST", "/pay", httpKey, "100"))
	requireRecProblem(t, dup, http.StatusConflict, "in-progress")
	assert.GreaterOrEqual(t, retryAfter(t, dup.Header()), 1)
	assert.LessOrEqual(t, retryAfter(t, dup.Header()), 60)
	assert.Empty(t, dup.Header().Get(idempotency.HeaderIdempotentReplayed))

	close(release)
	assert.Equal(t, http.StatusAccepted, (<-done).Code)
	after := serveHTTP(h, keyed("POST", "/pay", httpKey, "100"))
	assert.Equal(t, http.StatusAccepted, after.Code)
	assert.Equal(t, "true", after.Header().Get(idempotency.HeaderIdempotentReplayed))
	assert.EqualValues(t, 1, calls.Load())
}

func TestHTTPInFlightWaitReplaysInsteadOf409(t *testing.T) {
	_, b := httpStore(t)
	var calls atomic.Int32
	entered, release := make(chan struct{}, 1), make(chan struct{})
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys(), idempotency.WithInFlightWait(5*time.Second))
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		entered <- struct{}{}
		<-release
		_, _ = io.WriteString(w, "done")
	}))
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- serveHTTP(h, keyed("POST", "/pay", httpKey, "100")) }()
	<-entered
	go func() { done <- serveHTTP(h, keyed("POST", "/pay", httpKey, "100")) }()
	time.Sleep(100 * time.Millisecond) // the duplicate is waiting
	close(release)
	a, c := <-done, <-done
	assert.Equal(t, http.StatusOK, a.Code)
	assert.Equal(t, http.StatusOK, c.Code)
	assert.Equal(t, "done", a.Body.String())
	assert.Equal(t, "done", c.Body.String())
	assert.EqualValues(t, 1, calls.Load())
}

func TestHTTPDifferentPayloadGets422(t *testing.T) {
	_, b := httpStore(t)
	o := &orders{}
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys())
	h := mw(o)
	require.Equal(t, http.StatusCreated, serveHTTP(h, keyed("POST", "/orders", httpKey, `{"amount":100}`)).Code)

	for name, r := range map[string]*http.Request{
		"body":  keyed("POST", "/orders", httpKey, `{"amount":999}`),
		"query": keyed("POST", "/orders?currency=usd", httpKey, `{"amount":100}`),
	} {
		t.Run(name, func(t *testing.T) {
			requireRecProblem(t, serveHTTP(h, r), http.StatusUnprocessableEntity, "key-reused")
		})
	}
	assert.EqualValues(t, 1, o.calls.Load())
}

func TestHTTPMissingKey(t *testing.T) {
	_, b := httpStore(t)
	o := &orders{}

	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys(), idempotency.WithRequired(true))
	required := mw(o)
	requireRecProblem(t, serveHTTP(required, keyed("POST", "/orders", "", "x")), http.StatusBadRequest, "missing-key")
	assert.EqualValues(t, 0, o.calls.Load())

	mw2 := httpMiddleware(t, b, idempotency.WithGlobalKeys())
	optional := mw2(o)
	for range 2 {
		rec := serveHTTP(optional, keyed("POST", "/orders", "", "x"))
		assert.Equal(t, http.StatusCreated, rec.Code)
		assert.Empty(t, rec.Header().Get(idempotency.HeaderIdempotentReplayed))
	}
	assert.EqualValues(t, 2, o.calls.Load(), "without a key a request passes through")
}

func TestHTTPMalformedKeyGets400(t *testing.T) {
	_, b := httpStore(t)
	o := &orders{}
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys())
	h := mw(o)
	for name, key := range map[string]string{
		"empty quoted":   `""`,
		"blank":          `"   "`,
		"unterminated":   `"abc`,
		"bad escape":     `"a\b"`,
		"parameters":     `"abc";v=1`,
		"list":           `"a", "b"`,
		"non-ASCII":      `"clé"`,
		"control":        "\"a\x01b\"",
		"space unquoted": `a b`,
		"over-long":      `"` + strings.Repeat("k", idempotency.DefaultMaxKeyLength+1) + `"`,
	} {
		t.Run(name, func(t *testing.T) {
			requireRecProblem(t, serveHTTP(h, keyed("POST", "/orders", key, "x")), http.StatusBadRequest, "invalid-key")
		})
	}
	t.Run("two fields", func(t *testing.T) {
		r := keyed("POST", "/orders", `"a"`, "x")
		r.Header.Add(idempotency.HeaderIdempotencyKey, `"b"`)
		requireRecProblem(t, serveHTTP(h, r), http.StatusBadRequest, "invalid-key")
	})
	t.Run("longer limit", func(t *testing.T) {
		mw2 := httpMiddleware(t, b, idempotency.WithGlobalKeys(), idempotency.WithMaxKeyLength(300))
		long := mw2(o)
		r := keyed("POST", "/orders", strings.Repeat("k", 300), "x")
		assert.Equal(t, http.StatusCreated, serveHTTP(long, r).Code)
	})
	assert.EqualValues(t, 1, o.calls.Load(), "only the valid key ran")
}

func TestHTTPOtherMethodsPassThrough(t *testing.T) {
	_, b := httpStore(t)
	o := &orders{}
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys(), idempotency.WithRequired(true))
	h := mw(o)
	for _, m := range []string{"GET", "PUT", "DELETE"} {
		for range 2 {
			rec := serveHTTP(h, keyed(m, "/orders", httpKey, ""))
			assert.Equal(t, http.StatusCreated, rec.Code)
			assert.Empty(t, rec.Header().Get(idempotency.HeaderIdempotentReplayed))
		}
	}
	assert.EqualValues(t, 6, o.calls.Load())

	mw2 := httpMiddleware(t, b, idempotency.WithGlobalKeys(), idempotency.WithMethods("PUT"))
	puts := mw2(o)
	serveHTTP(puts, keyed("PUT", "/orders", httpKey, "x"))
	assert.Equal(t, "true", serveHTTP(puts, keyed("PUT", "/orders", httpKey, "x")).Header().Get(idempotency.HeaderIdempotentReplayed))
	serveHTTP(puts, keyed("POST", "/orders", httpKey, "x"))
	assert.EqualValues(t, 8, o.calls.Load(), "one PUT, then a POST that is no longer covered")
}

func TestHTTPBodyTooLargeGets413(t *testing.T) {
	_, b := httpStore(t)
	o := &orders{}
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys(), idempotency.WithMaxBody(8))
	h := mw(o)
	requireRecProblem(t, serveHTTP(h, keyed("POST", "/orders", httpKey, "123456789")), http.StatusRequestEntityTooLarge, "body-too-large")

	chunked := keyed("POST", "/orders", httpKey, "123456789")
	chunked.ContentLength = -1 // unknown length: the read itself is bounded
	requireRecProblem(t, serveHTTP(h, chunked), http.StatusRequestEntityTooLarge, "body-too-large")

	assert.Equal(t, http.StatusCreated, serveHTTP(h, keyed("POST", "/orders", httpKey, "12345678")).Code)
	assert.EqualValues(t, 1, o.calls.Load())
}

func TestHTTPServerErrorsAreNotRecorded(t *testing.T) {
	_, b := httpStore(t)
	var calls atomic.Int32
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys())
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			http.Error(w, "database down", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	first := serveHTTP(h, keyed("POST", "/orders", httpKey, "x"))
	assert.Equal(t, http.StatusServiceUnavailable, first.Code, "the client gets the handler's 5xx")
	assert.Equal(t, http.StatusCreated, serveHTTP(h, keyed("POST", "/orders", httpKey, "x")).Code, "the retry runs")
	assert.Equal(t, "true", serveHTTP(h, keyed("POST", "/orders", httpKey, "x")).Header().Get(idempotency.HeaderIdempotentReplayed))
	assert.EqualValues(t, 2, calls.Load())
}

func TestHTTPServerErrorsRecordedOnRequest(t *testing.T) {
	_, b := httpStore(t)
	var calls atomic.Int32
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys(), idempotency.WithStoreServerErrors(true))
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, "charged, then crashed", http.StatusInternalServerError)
	}))
	serveHTTP(h, keyed("POST", "/orders", httpKey, "x"))
	dup := serveHTTP(h, keyed("POST", "/orders", httpKey, "x"))
	assert.Equal(t, http.StatusInternalServerError, dup.Code)
	assert.Equal(t, "charged, then crashed\n", dup.Body.String())
	assert.Equal(t, "true", dup.Header().Get(idempotency.HeaderIdempotentReplayed))
	assert.EqualValues(t, 1, calls.Load())
}

func TestHTTPClientErrorsAreRecorded(t *testing.T) {
	_, b := httpStore(t)
	var calls atomic.Int32
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys())
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, "insufficient funds", http.StatusPaymentRequired)
	}))
	serveHTTP(h, keyed("POST", "/pay", httpKey, "x"))
	dup := serveHTTP(h, keyed("POST", "/pay", httpKey, "x"))
	assert.Equal(t, http.StatusPaymentRequired, dup.Code)
	assert.Equal(t, "insufficient funds\n", dup.Body.String())
	assert.Equal(t, "text/plain; charset=utf-8", dup.Header().Get("Content-Type"))
	assert.EqualValues(t, 1, calls.Load())
}

func TestHTTPResultTooLargeIsNotReplayed(t *testing.T) {
	_, b := httpStore(t, idempotency.WithMaxResult(64))
	var calls atomic.Int32
	big := strings.Repeat("x", 1000)
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys())
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.WriteString(w, big)
	}))
	first := serveHTTP(h, keyed("POST", "/report", httpKey, "x"))
	assert.Equal(t, big, first.Body.String(), "the first client gets the whole response")
	dup := serveHTTP(h, keyed("POST", "/report", httpKey, "x"))
	requireRecProblem(t, dup, http.StatusConflict, "result-not-retained")
	assert.Empty(t, dup.Header().Get("Retry-After"), "retrying will not help")
	assert.Equal(t, "true", dup.Header().Get(idempotency.HeaderIdempotentReplayed))
	assert.EqualValues(t, 1, calls.Load())
}

func TestHTTPPanicReleasesTheKey(t *testing.T) {
	_, b := httpStore(t)
	var calls atomic.Int32
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys())
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			panic("boom")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	assert.PanicsWithValue(t, "boom", func() { serveHTTP(h, keyed("POST", "/orders", httpKey, "x")) })
	assert.Equal(t, http.StatusCreated, serveHTTP(h, keyed("POST", "/orders", httpKey, "x")).Code)
	assert.EqualValues(t, 2, calls.Load())
}

func TestHTTPPrincipalScopesKeys(t *testing.T) {
	_, b := httpStore(t)
	o := &orders{}
	user := func(r *http.Request) string { return r.Header.Get("X-User") }
	mw := httpMiddleware(t, b, idempotency.WithPrincipal(user))
	scoped := mw(o)
	for _, u := range []string{"alice", "bob", "alice"} {
		r := keyed("POST", "/orders", httpKey, "x")
		r.Header.Set("X-User", u)
		serveHTTP(scoped, r)
	}
	assert.EqualValues(t, 2, o.calls.Load(), "alice and bob each ran once")
}

func TestHTTPRouteNamesTheOperation(t *testing.T) {
	_, b := httpStore(t)
	o := &orders{}
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys(), idempotency.WithRoute(func(*http.Request) string { return "orders" }))
	h := mw(o)
	serveHTTP(h, keyed("POST", "/orders/1", httpKey, "x"))
	// Same operation and key, another path: the key was used for another request.
	requireRecProblem(t, serveHTTP(h, keyed("POST", "/orders/2", httpKey, "x")), http.StatusUnprocessableEntity, "key-reused")
	assert.EqualValues(t, 1, o.calls.Load())
}

func TestHTTPHandlerGetsFence(t *testing.T) {
	_, b := httpStore(t)
	var fences []uint64
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys())
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, ok := idempotency.FenceFrom(r.Context())
		require.True(t, ok)
		fences = append(fences, f)
	}))
	serveHTTP(h, keyed("POST", "/a", `"k1"`, ""))
	serveHTTP(h, keyed("POST", "/a", `"k2"`, ""))
	require.Len(t, fences, 2)
	assert.NotZero(t, fences[0])
	_, ok := idempotency.FenceFrom(t.Context())
	assert.False(t, ok)
}

func TestHTTPStoreDown(t *testing.T) {
	// The store is reached through a gate, and "down" is the gate cut: a
	// killed server frees its port, which another package's server running
	// meanwhile can take (this test once got a 500 from such a stranger
	// instead of the outage it expects); a cut gate keeps its port and
	// refuses connections.
	srv := redistest.Start(t, redistest.Config{})
	g := redistest.NewGate(t, srv.Addr)
	b := barrier(t, g.Client())
	var logged atomic.Int32
	logErr := idempotency.WithErrorLog(func(*http.Request, error) { logged.Add(1) })
	var calls atomic.Int32
	var fenced atomic.Bool
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, ok := idempotency.FenceFrom(r.Context())
		fenced.Store(ok)
		body, _ := io.ReadAll(r.Body)
		_, _ = w.Write(body)
	})
	g.Cut()

	t.Run("fail closed", func(t *testing.T) {
		mw := httpMiddleware(t, b, idempotency.WithGlobalKeys(), logErr)
		rec := serveHTTP(mw(handler), keyed("POST", "/orders", httpKey, "payload"))
		requireRecProblem(t, rec, http.StatusServiceUnavailable, "store-unavailable")
		assert.GreaterOrEqual(t, retryAfter(t, rec.Header()), 1)
		assert.EqualValues(t, 0, calls.Load())
	})
	t.Run("fail open", func(t *testing.T) {
		mw2 := httpMiddleware(t, b, idempotency.WithGlobalKeys(), logErr, idempotency.WithFailOpen(true))
		h := mw2(handler)
		rec := serveHTTP(h, keyed("POST", "/orders", httpKey, "payload"))
		assert.Equal(t, http.StatusOK, rec.Code)
		assert.Equal(t, "payload", rec.Body.String(), "the handler gets the body")
		assert.EqualValues(t, 1, calls.Load())
		assert.False(t, fenced.Load(), "an unprotected run has no fence")
	})
	assert.EqualValues(t, 2, logged.Load(), "both outages were reported")
}

func TestMiddlewareRejectsBadConfiguration(t *testing.T) {
	_, b := httpStore(t)
	mw, err := idempotency.Middleware(nil, idempotency.WithGlobalKeys())
	assert.ErrorIs(t, err, redlease.ErrInvalid, "nil Barrier")
	assert.Nil(t, mw, "nil Barrier")
	mw, err = idempotency.Middleware(b, idempotency.WithGlobalKeys())
	require.NoError(t, err)
	assert.Panics(t, func() { mw(nil) }, "a nil handler panics, as net/http's Handle does")
	for name, o := range map[string]idempotency.HTTPOption{
		"max body":   idempotency.WithMaxBody(0),
		"key length": idempotency.WithMaxKeyLength(0),
		"principal":  idempotency.WithPrincipal(nil),
		"route":      idempotency.WithRoute(nil),
		"methods":    idempotency.WithMethods(),
		"header":     idempotency.WithReplayHeaders(""),
		"wait":       idempotency.WithInFlightWait(-time.Second),
		"error log":  idempotency.WithErrorLog(nil),
		"timeout 0":  idempotency.WithHandlerTimeout(0),
		"timeout <0": idempotency.WithHandlerTimeout(-time.Second),
		"status 200": idempotency.WithTransientStatuses(http.StatusTooManyRequests, http.StatusOK),
		"status 399": idempotency.WithTransientStatuses(399),
		"status 600": idempotency.WithTransientStatuses(600),
	} {
		mw, err := idempotency.Middleware(b, idempotency.WithGlobalKeys(), o)
		assert.ErrorIs(t, err, redlease.ErrInvalid, name)
		assert.Nil(t, mw, name)
	}
}

// TestHTTPRealServer runs the middleware behind a real listener and client:
// what a client on the wire sees, with no goroutine of ours left behind.
func TestHTTPRealServer(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // registered first, so it runs last
	_, b := httpStore(t)

	o := &orders{}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("/orders", o)
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
		w.WriteHeader(http.StatusNoContent)
	})
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys(), idempotency.WithReplayHeaders("Content-Type", "Location", "X-Request-Id"))
	ts := httptest.NewServer(mw(mux))
	t.Cleanup(ts.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}

	do := func(method, path, key, body string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequestWithContext(t.Context(), method, ts.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		if key != "" {
			req.Header.Set(idempotency.HeaderIdempotencyKey, key)
		}
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, b
	}

	first, firstBody := do("POST", "/orders", httpKey, `{"sku":"a"}`)
	require.Equal(t, http.StatusCreated, first.StatusCode)
	dup, dupBody := do("POST", "/orders", httpKey, `{"sku":"a"}`)
	assert.Equal(t, http.StatusCreated, dup.StatusCode)
	assert.Equal(t, firstBody, dupBody)
	assert.Equal(t, "/orders/1", dup.Header.Get("Location"))
	assert.Equal(t, "1", dup.Header.Get("X-Request-Id"), "a configured field is replayed")
	assert.Equal(t, "true", dup.Header.Get(idempotency.HeaderIdempotentReplayed))

	resp, body := do("POST", "/orders", httpKey, `{"sku":"b"}`)
	requireProblem(t, http.StatusUnprocessableEntity, resp.Header, body, resp.StatusCode, "key-reused")
	resp, body = do("POST", "/orders", `"bad\key"`, `{}`)
	requireProblem(t, http.StatusBadRequest, resp.Header, body, resp.StatusCode, "invalid-key")
	get, _ := do("GET", "/orders", httpKey, "")
	assert.Equal(t, http.StatusCreated, get.StatusCode)
	assert.Empty(t, get.Header.Get(idempotency.HeaderIdempotentReplayed))
	assert.EqualValues(t, 2, o.calls.Load(), "the POST once, the GET once")

	// A duplicate while the first runs.
	var wg sync.WaitGroup
	var slowStatus int
	wg.Go(func() {
		resp, _ := do("POST", "/slow", `"slow-1"`, "")
		slowStatus = resp.StatusCode
	})
	<-entered
	resp, body = do("POST", "/slow", `"slow-1"`, "")
	requireProblem(t, http.StatusConflict, resp.Header, body, resp.StatusCode, "in-progress")
	assert.GreaterOrEqual(t, retryAfter(t, resp.Header), 1)
	close(release)
	wg.Wait()
	assert.Equal(t, http.StatusNoContent, slowStatus)
	resp, _ = do("POST", "/slow", `"slow-1"`, "")
	assert.Equal(t, http.StatusNoContent, resp.StatusCode)
	assert.Equal(t, "true", resp.Header.Get(idempotency.HeaderIdempotentReplayed))
}

// Keys are scoped to a principal unless the caller declares them global:
// a Middleware with neither is refused at construction (two clients that
// pick the same key would read each other's stored responses), so is one
// with both, and a keyed request whose principal is empty gets 401.
func TestHTTPPrincipalIsRequired(t *testing.T) {
	_, b := httpStore(t)
	_, err := idempotency.Middleware(b)
	require.ErrorIs(t, err, redlease.ErrInvalid)
	assert.Contains(t, err.Error(), "WithPrincipal")
	user := func(r *http.Request) string { return r.Header.Get("X-User") }
	_, err = idempotency.Middleware(b, idempotency.WithPrincipal(user), idempotency.WithGlobalKeys())
	require.ErrorIs(t, err, redlease.ErrInvalid)
	_, err = idempotency.Middleware(nil, idempotency.WithGlobalKeys())
	require.ErrorIs(t, err, redlease.ErrInvalid)
	mw := httpMiddleware(t, b, idempotency.WithPrincipal(user))
	o := &orders{}
	h := mw(o)
	anonymous := serveHTTP(h, keyed("POST", "/orders", httpKey, "x"))
	assert.Equal(t, http.StatusUnauthorized, anonymous.Code)
	assert.Contains(t, anonymous.Body.String(), `"no-principal"`)
	assert.Zero(t, o.calls.Load(), "an anonymous keyed request does not run")

	// Alice's response is never bob's, with the same key.
	for _, u := range []string{"alice", "bob"} {
		r := keyed("POST", "/orders", httpKey, "x")
		r.Header.Set("X-User", u)
		assert.Equal(t, http.StatusCreated, serveHTTP(h, r).Code, u)
	}
	assert.EqualValues(t, 2, o.calls.Load())

	// Declared global: one record for everyone who sends the key.
	g := httpMiddleware(t, b, idempotency.WithGlobalKeys())
	og := &orders{}
	for range 2 {
		assert.Equal(t, http.StatusCreated, serveHTTP(g(og), keyed("POST", "/global", httpKey, "x")).Code)
	}
	assert.EqualValues(t, 1, og.calls.Load())
}
