package idempotency_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
)

// A token is good for the scope it was issued for only: the scope cannot be
// shifted into the token (or out of it) across a ':'.
func TestTokenIssuedForOneScopeIsRefusedInAnother(t *testing.T) {
	tokens, err := idempotency.NewTokens(store(t), "")
	require.NoError(t, err)
	ctx := t.Context()
	tok, err := tokens.Issue(ctx, "form:checkout", 0)
	require.NoError(t, err)

	assert.ErrorIs(t, tokens.Consume(ctx, "form", "checkout:"+tok), idempotency.ErrTokenUnknown,
		"a token of scope form:checkout is not one of scope form")
	assert.ErrorIs(t, tokens.Consume(ctx, "", "form:checkout:"+tok), idempotency.ErrTokenUnknown,
		"nor one of the empty scope")
	assert.NoError(t, tokens.Consume(ctx, "form:checkout", tok), "the refusals did not use it up")
}

// countingHook counts the commands a client sends.
type countingHook struct{ n atomic.Int32 }

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int32(len(cmds)))
		return next(ctx, cmds)
	}
}

// Consume accepts exactly the tokens Issue produces (22 base64url
// characters, '.', the expiry in base36 digits); anything else is unknown,
// and is refused without asking the store.
func TestMalformedTokensAreUnknownWithoutARoundTrip(t *testing.T) {
	c := store(t)
	hook := &countingHook{}
	c.AddHook(hook)
	tokens, err := idempotency.NewTokens(c, "")
	require.NoError(t, err)
	ctx := t.Context()
	tok, err := tokens.Issue(ctx, "form", time.Hour)
	require.NoError(t, err)
	body, exp, ok := strings.Cut(tok, ".")
	require.True(t, ok, tok)
	require.Len(t, body, 22, tok)

	// A valid body (16 zero bytes) and a valid expiry, to build bad ones
	// that differ from a good token in one way only.
	const zeros = "AAAAAAAAAAAAAAAAAAAAAA"
	future := time.Now().Add(time.Hour).UnixMilli()
	farExp := strconv.FormatInt(future, 36)

	malformed := map[string]string{
		"empty":                               "",
		"just a dot":                          ".",
		"no expiry":                           body + ".",
		"no body":                             "." + exp,
		"no dot":                              body + exp,
		"extra character at the end":          tok + "_",
		"extra character in front":            "x" + tok,
		"body one short":                      body[1:] + "." + exp,
		"body one long":                       body + "A." + exp,
		"body with a non-base64url character": "+" + body[1:] + "." + exp,
		"body with a newline the decoder would skip": body[:11] + "\n" + body[11:21] + "." + exp,
		"body with padding bits set (never encoded)": zeros[:21] + "B." + farExp,
		"padded body":                  "AAAAAAAAAAAAAAAAAAAAAA==." + farExp,
		"expiry not base36":            body + "." + exp[:len(exp)-1] + "!",
		"expiry in upper case":         body + "." + strings.ToUpper(exp),
		"expiry with a sign":           body + ".+" + exp,
		"expiry with a leading zero":   body + ".0" + exp,
		"expiry overflowing int64":     body + "." + strings.Repeat("z", 14),
		"second dot":                   body + "." + exp + "." + exp,
		"embedded ':' in the expiry":   body + "." + exp[:3] + ":" + exp[3:],
		"embedded ':' in the body":     body[:5] + ":" + body[6:] + "." + exp,
		"scope shifted into the token": "form:" + tok,
		"embedded '.' in the body":     body[:5] + "." + body[6:] + "." + exp,
		"trailing space":               tok + " ",
		"trailing newline":             tok + "\n",
	}
	before := hook.n.Load()
	for name, bad := range malformed {
		assert.ErrorIs(t, tokens.Consume(ctx, "form", bad), idempotency.ErrTokenUnknown, "%s: %q", name, bad)
	}
	assert.Equal(t, before, hook.n.Load(), "malformed tokens are refused without a round trip")

	require.NoError(t, tokens.Consume(ctx, "form", tok), "the token itself is still good")
	assert.ErrorIs(t, tokens.Consume(ctx, "form", tok), idempotency.ErrTokenUsed)
}

// A token prefix from which a scope could reach redlease.ReservedPrefix is
// refused: that namespace holds redlease's own keys (fence counters,
// markers), which a token must never overwrite.
func TestTokenPrefixMayNotReachTheReservedNamespace(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never used
	t.Cleanup(func() { _ = c.Close() })
	for _, prefix := range []string{redlease.ReservedPrefix, redlease.ReservedPrefix + "tok:", "redlease", "red"} {
		_, err := idempotency.NewTokens(c, prefix)
		assert.ErrorIs(t, err, redlease.ErrInvalid, "prefix %q", prefix)
		assert.ErrorContains(t, err, "reserved", "prefix %q: the error says why", prefix)
	}
	for _, prefix := range []string{"", "tok:", "app:redlease:", "redleases:"} {
		_, err := idempotency.NewTokens(c, prefix)
		assert.NoError(t, err, "prefix %q", prefix)
	}
}

func TestOneTimeTokens(t *testing.T) {
	tokens, err := idempotency.NewTokens(store(t), "")
	require.NoError(t, err)
	ctx := t.Context()
	tok, err := tokens.Issue(ctx, "form:checkout", 0)
	require.NoError(t, err)
	var ok, used atomic.Int32
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			switch err := tokens.Consume(ctx, "form:checkout", tok); {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, idempotency.ErrTokenUsed):
				used.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	assert.EqualValues(t, 1, ok.Load(), "exactly one consumer succeeds")
	assert.EqualValues(t, 49, used.Load())
	assert.ErrorIs(t, tokens.Consume(ctx, "form:other", tok), idempotency.ErrTokenUnknown, "tokens are scoped")
	assert.ErrorIs(t, tokens.Consume(ctx, "form:checkout", "made-up"), idempotency.ErrTokenUnknown)

	short, err := tokens.Issue(ctx, "form:checkout", 50*time.Millisecond)
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)
	assert.ErrorIs(t, tokens.Consume(ctx, "form:checkout", short), idempotency.ErrTokenExpired)
}

// The same for one-time tokens: Issue and Consume return at their ctx.
func TestTokensAreBoundedByTheirContextWithADefaultClient(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	tokens, err := idempotency.NewTokens(pausedStore(t), "")
	require.NoError(t, err)
	for name, call := range map[string]func(context.Context) error{
		"issue": func(ctx context.Context) error {
			_, err := tokens.Issue(ctx, "form", time.Minute)
			return err
		},
		"consume": func(ctx context.Context) error {
			// A well-formed token (16 zero bytes, an hour to live): only the
			// store can say whether it was issued.
			return tokens.Consume(ctx, "form", "AAAAAAAAAAAAAAAAAAAAAA."+strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 36))
		},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		start := time.Now()
		err := call(ctx)
		took := time.Since(start)
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded, name)
		assertWithin(t, probe, time.Second, start, took, "%s with a 300ms ctx and the store paused: %v", name, err)
	}
}

// The reply to a consume is lost after the store applied it (held in a
// gate, then the connection cut), and go-redis resends the command on a
// new connection. The token's only consumer must hear that it consumed
// the token, not ErrTokenUsed; a second consumer still hears ErrTokenUsed,
// and the consumed token's key keeps a TTL.
func TestConsumeWhoseReplyIsLostAndResentSucceeds(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	gate := redistest.NewGate(t, srv.Addr)
	c := gate.Client()
	tokens, err := idempotency.NewTokens(c, "")
	require.NoError(t, err)
	ctx := t.Context()
	require.NoError(t, idempotency.LoadScripts(ctx, c), "no NOSCRIPT round trip through the gate")
	tok, err := tokens.Issue(ctx, "pay", time.Minute)
	require.NoError(t, err)
	key := "tok:pay:" + tok

	gate.HoldReplies(key)
	done := make(chan error, 1)
	go func() { done <- tokens.Consume(ctx, "pay", tok) }()
	require.NoError(t, gate.WaitHeld(1, "", 5*time.Second), "the consume's reply is held: the store applied it")
	gate.HoldReplies("")
	gate.Cut() // the held reply goes with its connection: go-redis resends
	gate.Heal()
	first := redistest.Await(t, probe, done, 10*time.Second, 3, "Consume did not return")
	assert.NoError(t, first, "the only consumer, whose reply was lost, consumed the token")

	assert.ErrorIs(t, tokens.Consume(ctx, "pay", tok), idempotency.ErrTokenUsed, "another consumer finds it used")
	admin := srv.Client()
	n, err := admin.Exists(ctx, key).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "the used token is remembered")
	keys, err := admin.Keys(ctx, "*").Result()
	require.NoError(t, err)
	require.NotEmpty(t, keys)
	for _, k := range keys {
		ttl, err := admin.PTTL(ctx, k).Result()
		require.NoError(t, err)
		assert.Positive(t, ttl, "%s has a TTL", k)
	}
}
