package idempotency_test

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
)

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
			mw, err := idempotency.Middleware(b, append([]idempotency.HTTPOption{idempotency.WithGlobalKeys()}, tc.opts...)...)
			require.NoError(t, err)
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
