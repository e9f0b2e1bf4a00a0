package idempotency_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
)

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
			mw, err := idempotency.Middleware(b, idempotency.WithGlobalKeys())
			require.NoError(t, err)
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
