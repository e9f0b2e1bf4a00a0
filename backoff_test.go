package redlease

import (
	"testing"
	"time"
)

func TestBackoffDoublesWithinJitterBounds(t *testing.T) {
	const lo, hi = 10 * time.Millisecond, 320 * time.Millisecond
	cases := []struct {
		attempt int
		want    time.Duration // the ceiling d; draws must lie in [d/2, d]
	}{
		{1, 10 * time.Millisecond},
		{2, 20 * time.Millisecond},
		{3, 40 * time.Millisecond},
		{6, 320 * time.Millisecond},
		{7, 320 * time.Millisecond},
		{1000, 320 * time.Millisecond},
	}
	for _, c := range cases {
		for range 200 {
			got := backoff(c.attempt, lo, hi)
			if got < c.want/2 || got > c.want {
				t.Fatalf("backoff(%d) = %v, want within [%v, %v]", c.attempt, got, c.want/2, c.want)
			}
		}
	}
}
