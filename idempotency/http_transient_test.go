package idempotency_test

import (
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
)

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
			mw, err := idempotency.Middleware(b, idempotency.WithGlobalKeys())
			require.NoError(t, err)
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
			mw, err := idempotency.Middleware(b, append([]idempotency.HTTPOption{idempotency.WithGlobalKeys()}, tc.opts...)...)
			require.NoError(t, err)
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
