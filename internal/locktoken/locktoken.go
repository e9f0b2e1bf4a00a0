// Package locktoken makes the base tokens of Locker's Lock and TryLock
// calls: 128 random bits from crypto/rand, base64url-encoded (22
// characters), unless the call's context carries a seed (WithSeed).
//
// Only a simulation seeds them: chaos/sim replays a run from its seed, and
// fair mode orders two waiters whose tickets tie by their ids, which are
// these tokens. Go's internal rule lets only packages whose import path
// starts with github.com/redlease/redlease import this package (the
// simulator's among them), so an application's context never carries a
// seed and every token of a production call is crypto-random.
package locktoken

import (
	"context"
	cryptorand "crypto/rand"
	"encoding/base64"
	"encoding/binary"
	"hash/fnv"
	"sync"

	"github.com/redlease/redlease/internal/splitmix"
)

// seedKey is the context key of WithSeed.
type seedKey struct{}

// source is a seeded context's token draws: per key, in call order.
type source struct {
	seed uint64
	mu   sync.Mutex
	n    map[string]uint64 // tokens drawn per key
}

// WithSeed returns a copy of ctx whose tokens (New) are drawn from seed:
// the same seed and the same sequence of calls per key give the same
// tokens, and no two calls under one such context get the same token.
// Contexts derived from it share its draws.
func WithSeed(ctx context.Context, seed uint64) context.Context {
	return context.WithValue(ctx, seedKey{}, &source{seed: seed, n: map[string]uint64{}})
}

// New returns a new token for a call on key: crypto/rand's, or the next
// of ctx's seeded draws for key if ctx carries WithSeed.
func New(ctx context.Context, key string) string {
	var b [16]byte
	if s, ok := ctx.Value(seedKey{}).(*source); ok {
		s.mu.Lock()
		s.n[key]++
		n := s.n[key]
		s.mu.Unlock()
		f := fnv.New64a()
		_, _ = f.Write([]byte(key))
		h := splitmix.Mix(s.seed, f.Sum64())
		binary.LittleEndian.PutUint64(b[:8], splitmix.Mix(h, n<<1))
		binary.LittleEndian.PutUint64(b[8:], splitmix.Mix(h, n<<1|1))
	} else {
		_, _ = cryptorand.Read(b[:]) // never fails: crypto/rand.Read aborts the program instead
	}
	var out [22]byte
	base64.RawURLEncoding.Encode(out[:], b[:])
	return string(out[:])
}
