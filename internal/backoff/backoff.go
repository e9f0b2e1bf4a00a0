// Package backoff is the jittered exponential backoff shared by the
// Locker's retries, the wake hub's pacing of undo notices and the failover
// Watcher's resubscriptions, and the source of their jitter.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/redlease/redlease/internal/splitmix"
)

// Jittered returns the wait after attempt n (n >= 1): d = min(base ×
// 2^(n-1), limit), drawn uniformly from [d/2, d] by s.
func Jittered(s *Stream, n int, base, limit time.Duration) time.Duration {
	d := base
	for i := 1; i < n && d < limit; i++ {
		if d > limit/2 {
			d = limit // doubling would pass the limit (or overflow)
			break
		}
		d *= 2
	}
	half := d / 2
	return half + s.N(d-half+1)
}

// seedKey is the context key of WithSeed.
type seedKey struct{}

// WithSeed returns a copy of ctx whose Streams (NewStream) draw from seed,
// not from math/rand/v2's global source: the same seed, the same draws.
// Only a simulation sets it (chaos/sim replays a run from its seed); a
// production context never carries one, since nothing outside this module
// can import this package.
func WithSeed(ctx context.Context, seed uint64) context.Context {
	return context.WithValue(ctx, seedKey{}, seed)
}

// Stream is the jitter draws of one consumer (one Lock call's retries, one
// waiter's undo pauses, one Sentinel subscription's pauses). A nil Stream,
// or one made from a context without WithSeed, draws from math/rand/v2's
// global source. Not safe for concurrent use: each consumer makes its own.
type Stream struct {
	seed   uint64
	n      uint64
	seeded bool
}

// NewStream returns a Stream seeded by ctx's WithSeed and tag (consumers
// of one context draw apart by their tags), or one drawing from
// math/rand/v2's global source when ctx carries no seed.
func NewStream(ctx context.Context, tag uint64) *Stream {
	seed, ok := ctx.Value(seedKey{}).(uint64)
	if !ok {
		return &Stream{}
	}
	return &Stream{seed: splitmix.Mix(seed, tag), seeded: true}
}

// N returns a duration drawn uniformly from [0, d) (0 if d <= 0).
func (s *Stream) N(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	if s == nil || !s.seeded {
		return rand.N(d)
	}
	s.n++
	return time.Duration(splitmix.Mix(s.seed, s.n) % uint64(d))
}
