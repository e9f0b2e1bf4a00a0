package idempotency_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
)

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
			mw, err := idempotency.Middleware(b, append([]idempotency.HTTPOption{idempotency.WithGlobalKeys()}, tc.opts...)...)
			require.NoError(t, err)
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
	mw, err := idempotency.Middleware(b, idempotency.WithGlobalKeys(), idempotency.WithStoreServerErrors(true))
	require.NoError(t, err)
	ts := wireServe(t, mw(a))

	got := wireExchanges(t, ts.URL+"/pay", 2)
	assert.Equal(t, http.StatusInternalServerError, got[1].resp.StatusCode)
	assert.Equal(t, "run 1: 500", string(got[1].body))
	assert.Equal(t, "true", got[1].resp.Header.Get(idempotency.HeaderIdempotentReplayed))
	assert.EqualValues(t, 1, a.runs.Load())
}
