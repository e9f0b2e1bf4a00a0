package backoff

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestJitteredBounds(t *testing.T) {
	ctx := WithSeed(context.Background(), 7)
	for _, s := range []*Stream{nil, NewStream(context.Background(), 0), NewStream(ctx, 0)} {
		n := 0
		for attempt := 1; attempt <= 12; attempt++ {
			d := min(10*time.Millisecond<<(attempt-1), time.Second)
			for range 100 {
				got := Jittered(s, attempt, 10*time.Millisecond, time.Second)
				require.GreaterOrEqual(t, got, d/2)
				require.LessOrEqual(t, got, d)
				n++
			}
		}
		require.Equal(t, 1200, n)
	}
}

func TestSeededStreamsRepeat(t *testing.T) {
	ctx := WithSeed(context.Background(), 42)
	draw := func(s *Stream) []time.Duration {
		var ds []time.Duration
		for range 50 {
			ds = append(ds, s.N(time.Second))
		}
		return ds
	}
	a, b := draw(NewStream(ctx, 3)), draw(NewStream(ctx, 3))
	require.Equal(t, a, b, "one seed and tag, one sequence")
	require.NotEqual(t, a, draw(NewStream(ctx, 4)), "another tag draws apart")
	require.NotEqual(t, a, draw(NewStream(WithSeed(context.Background(), 43), 3)), "another seed draws apart")
	distinct := map[time.Duration]bool{}
	for _, d := range a {
		require.GreaterOrEqual(t, d, time.Duration(0))
		require.Less(t, d, time.Second)
		distinct[d] = true
	}
	require.Greater(t, len(distinct), 45, "the draws spread")
	// Without a seed, draws come from the global source: two streams differ.
	require.NotEqual(t, draw(NewStream(context.Background(), 3)), draw(NewStream(context.Background(), 3)))
	require.Equal(t, time.Duration(0), NewStream(ctx, 0).N(0))
}
