package idempotency_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
)

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
	mw, err := idempotency.Middleware(b, idempotency.WithPrincipal(user))
	require.NoError(t, err)
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
	g, err := idempotency.Middleware(b, idempotency.WithGlobalKeys())
	require.NoError(t, err)
	og := &orders{}
	for range 2 {
		assert.Equal(t, http.StatusCreated, serveHTTP(g(og), keyed("POST", "/global", httpKey, "x")).Code)
	}
	assert.EqualValues(t, 1, og.calls.Load())
}
