package idempotency_test

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
)

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
			mw, err := idempotency.Middleware(b, append([]idempotency.HTTPOption{idempotency.WithGlobalKeys()}, sets[tc.set]...)...)
			require.NoError(t, err)
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
