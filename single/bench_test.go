package single_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/single"
)

// rawRelease is the floor's compare-and-delete.
var rawRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkAcquireRelease compares, on one real node in one run: redlease
// single (with and without fencing) and the raw floor (SET NX PX, then an
// EVALSHA compare-and-delete on the same client). The comparison with
// bsm/redislock is bench's BenchmarkSingle (the bench module, where the
// peers are).
func BenchmarkAcquireRelease(b *testing.B) {
	c := redistest.Start(b, redistest.Config{}).Client()
	ctx := context.Background()

	run := func(name string, s redlease.Strategy) {
		b.Run(name, func(b *testing.B) {
			locker, err := redlease.New(s, redlease.WithTTL(10*time.Second))
			require.NoError(b, err)
			key := b.Name()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				lk, err := locker.TryLock(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				if err := lk.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	strategy, err := single.New(c)
	require.NoError(b, err)
	run("lib=redlease", strategy)
	strategy2, err := single.New(c, single.WithoutFencing())
	require.NoError(b, err)
	run("lib=redlease/nofence", strategy2)

	b.Run("lib=raw", func(b *testing.B) {
		key := b.Name()
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			ok, err := c.SetNX(ctx, key, "token-0123456789ab", 10*time.Second).Result()
			if err != nil || !ok {
				b.Fatal(ok, err)
			}
			if err := rawRelease.Run(ctx, c, []string{key}, "token-0123456789ab").Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
