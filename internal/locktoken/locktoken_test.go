package locktoken

import (
	"context"
	"encoding/base64"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestUnseededTokensAreRandom(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		tok := New(context.Background(), "k")
		require.Len(t, tok, 22)
		b, err := base64.RawURLEncoding.DecodeString(tok)
		require.NoError(t, err)
		require.Len(t, b, 16)
		require.False(t, seen[tok], "a token repeated")
		seen[tok] = true
	}
	require.Len(t, seen, 1000)
}

func TestSeededTokensReplay(t *testing.T) {
	draw := func(seed uint64) []string {
		ctx := WithSeed(context.Background(), seed)
		var toks []string
		for _, key := range []string{"a", "b", "a", "a", "c", "b"} {
			toks = append(toks, New(ctx, key))
		}
		return toks
	}
	a := draw(7)
	require.Equal(t, a, draw(7), "one seed, one sequence")
	require.NotEqual(t, a, draw(8), "another seed draws apart")
	seen := map[string]bool{}
	for _, tok := range append(a, draw(8)...) {
		require.Len(t, tok, 22)
		require.False(t, seen[tok], "a seeded token repeated: %s", tok)
		seen[tok] = true
	}
	require.Len(t, seen, 12)
	// Per key: the draws on one key do not depend on calls on others.
	ctx := WithSeed(context.Background(), 7)
	require.Equal(t, a[0], New(ctx, "a"))
	require.Equal(t, a[2], New(ctx, "a"))
	require.Equal(t, a[1], New(WithSeed(context.Background(), 7), "b"))
	// A context derived from a seeded one shares its draws.
	type other struct{}
	ctx = WithSeed(context.Background(), 7)
	require.Equal(t, a[0], New(context.WithValue(ctx, other{}, 1), "a"))
	require.Equal(t, a[2], New(ctx, "a"))
}
