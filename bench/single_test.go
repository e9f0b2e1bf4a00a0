package bench_test

import (
	"crypto/rand"
	"encoding/base64"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/single"
)

// singleTTL is the lock TTL of every one-node benchmark.
const singleTTL = 10 * time.Second

// rawRelease is the floor's compare-and-delete; go-redis's Script.Run sends
// it as EVALSHA (EVAL once, on NOSCRIPT).
var rawRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkSingle: one acquire and one release of one key per op on one
// node, through one client: redlease's single strategy (fences on, its
// default, and off), bsm/redislock, and the raw floor — SET NX PX with a
// fresh random token, then an EVALSHA compare-and-delete, which is what
// any correct one-node lock must send. Sequential ops reuse one pooled
// connection.
func BenchmarkSingle(b *testing.B) {
	c := newClient(b, nodes(b, 1)[0])

	redleaseOne := func(s redlease.Strategy) func(b *testing.B) {
		return func(b *testing.B) {
			locker, err := redlease.New(s, redlease.WithTTL(singleTTL))
			require.NoError(b, err)
			key := keyFor(b)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				lk, err := locker.TryLock(background, key)
				if err != nil {
					b.Fatal(err)
				}
				if err := lk.Release(background); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	strategy, err := single.New(c)
	require.NoError(b, err)
	b.Run("lib=redlease", redleaseOne(strategy))
	strategy2, err := single.New(c, single.WithoutFencing())
	require.NoError(b, err)
	b.Run("lib=redlease-nofence", redleaseOne(strategy2))

	b.Run("lib=redislock", func(b *testing.B) {
		rl := redislock.New(c)
		key := keyFor(b)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			lk, err := rl.Obtain(background, key, singleTTL, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(background); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("lib=raw", func(b *testing.B) {
		key := keyFor(b)
		var tok [16]byte
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			_, _ = rand.Read(tok[:])
			token := base64.RawURLEncoding.EncodeToString(tok[:])
			ok, err := c.SetNX(background, key, token, singleTTL).Result()
			if err != nil || !ok {
				b.Fatal(ok, err)
			}
			n, err := rawRelease.Run(background, c, []string{key}, token).Int64()
			if err != nil || n != 1 {
				b.Fatal(n, err)
			}
		}
	})
}
