package idempotency

import (
	"context"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
)

// v1Record is a response as version 1 of the record codec wrote it
// (before Vary was recorded): version, status, field pairs, body.
func v1Record(status int, fields []string, body string) []byte {
	out := []byte{responseVersionV1}
	out = binary.AppendUvarint(out, uint64(status))
	out = binary.AppendUvarint(out, uint64(len(fields)/2))
	for _, f := range fields {
		out = binary.AppendUvarint(out, uint64(len(f)))
		out = append(out, f...)
	}
	return append(out, body...)
}

// A record written by the version 1 codec, already in the store when the
// Middleware is upgraded, is still replayed as it was recorded: it names
// no Vary field, so any duplicate gets it, as before.
func TestHTTPOldRecordIsReplayed(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	b, err := New(srv.Client())
	require.NoError(t, err)
	const key, body = "k-1", "100"
	var frame []byte
	for _, f := range []string{http.MethodPost, "/pay"} {
		frame = binary.AppendUvarint(frame, uint64(len(f)))
		frame = append(frame, f...)
	}
	frame = append(frame, body...)
	rec := v1Record(http.StatusCreated, []string{"Content-Type", "application/json", "Content-Encoding", "gzip", "Location", "/orders/1"}, "gzip bytes")
	out, err := b.do(t.Context(), nsHTTP, Request{Key: Key("http", "", http.MethodPost, "/pay", key), Fingerprint: PayloadHash(frame)},
		func(context.Context, uint64) ([]byte, error) { return rec, nil }, 0)
	require.NoError(t, err)
	require.False(t, out.Replayed)

	mw, err := Middleware(b, WithGlobalKeys())
	require.NoError(t, err)
	h := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Error("the handler ran") }))
	for _, ae := range []string{"", "gzip", "identity"} {
		r := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader(body))
		r.Header.Set(HeaderIdempotencyKey, key)
		if ae != "" {
			r.Header.Set("Accept-Encoding", ae)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		assert.Equal(t, http.StatusCreated, w.Code, "Accept-Encoding %q: body %s", ae, w.Body)
		assert.Equal(t, "gzip bytes", w.Body.String())
		assert.Equal(t, "gzip", w.Header().Get("Content-Encoding"))
		assert.Equal(t, "/orders/1", w.Header().Get("Location"))
		assert.Equal(t, "true", w.Header().Get(HeaderIdempotentReplayed))
	}
}

// The codec reads back what it wrote, Vary digests included, and refuses
// records cut short anywhere.
func TestResponseCodecRoundTrip(t *testing.T) {
	b := &bufferedResponse{header: make(http.Header)}
	b.header.Set("Content-Type", "text/plain")
	b.header.Add("Vary", "accept-encoding, Accept-Language")
	b.header.Add("Vary", "*, Accept-Encoding")
	b.WriteHeader(http.StatusAccepted)
	_, _ = b.Write([]byte("body"))
	r := httptest.NewRequest(http.MethodPost, "/pay", nil)
	r.Header.Set("Accept-Encoding", "gzip")
	rec := encodeResponse(b, withRecordedHeaders(nil), r)
	got, err := decodeResponse(rec)
	require.NoError(t, err)
	assert.Equal(t, http.StatusAccepted, got.status)
	assert.Equal(t, "body", string(got.body))
	assert.Equal(t, []string{"accept-encoding, Accept-Language", "*, Accept-Encoding"}, got.header.Values("Vary"))
	require.Len(t, got.vary, 2, "each name once, no *")
	assert.Equal(t, "Accept-Encoding", got.vary[0].name)
	assert.Equal(t, "Accept-Language", got.vary[1].name)
	assert.Empty(t, got.varyMismatch(r))
	other := r.Clone(t.Context())
	other.Header.Set("Accept-Language", "")
	assert.Equal(t, []string{"Accept-Language"}, got.varyMismatch(other), "an empty field is not an absent one")

	bodyAt := len(rec) - len("body")
	for i := 1; i < bodyAt; i++ {
		_, err := decodeResponse(rec[:i])
		assert.ErrorIs(t, err, errBadRecord, "cut at %d", i)
	}
}
