package idempotency_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
)

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
