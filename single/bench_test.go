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
// EVALSHA compare-and-delete on the same client), through a client with
// ContextTimeoutEnabled (client=ctx) and one with go-redis's defaults
// (client=default), whose calls redlease bounds on a goroutine of their
// own. The comparison with bsm/redislock is bench's BenchmarkSingle (the
// bench module, where the peers are).
func BenchmarkAcquireRelease(b *testing.B) {
	srv := redistest.Start(b, redistest.Config{})
	ctx := context.Background()
	for _, client := range []struct {
		name string
		cte  bool
	}{{"ctx", true}, {"default", false}} {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: client.cte})
		b.Cleanup(func() { _ = c.Close() })
		strategy, err := single.New(c)
		require.NoError(b, err)
		benchTryLock(b, "client="+client.name+"/lib=redlease", strategy)
		strategy2, err := single.New(c, single.WithoutFencing())
		require.NoError(b, err)
		benchTryLock(b, "client="+client.name+"/lib=redlease-nofence", strategy2)

		b.Run("client="+client.name+"/lib=raw", func(b *testing.B) {
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
}

// benchTryLock runs TryLock and Release of one key on a Locker with opts.
func benchTryLock(b *testing.B, name string, s redlease.Strategy, opts ...redlease.Option) {
	benchTake(b, name, s, (*redlease.Locker).TryLock, opts...)
}

// benchTake runs take (TryLock or Lock) and Release of one key on a
// Locker with opts.
func benchTake(b *testing.B, name string, s redlease.Strategy,
	take func(*redlease.Locker, context.Context, string, ...redlease.LockOption) (*redlease.Lock, error), opts ...redlease.Option) {
	b.Run(name, func(b *testing.B) {
		locker, err := redlease.New(s, append([]redlease.Option{redlease.WithTTL(10 * time.Second)}, opts...)...)
		require.NoError(b, err)
		ctx := context.Background()
		key := b.Name()
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			lk, err := take(locker, ctx, key)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkWakeAndFairUnused: what release notices (wake) and fair mode
// cost a caller that uses neither, on one node in one run. Lock of a free
// key then Release, on a Locker whose Lock would subscribe to releases
// after a refusal (wake=on, the default) and on one that polls
// (wake=off, WithPolling); and the same on a node where another waiter of
// this process is subscribed to the releases of another key
// (listening=1), so that the process's subscription is live.
func BenchmarkWakeAndFairUnused(b *testing.B) {
	c := redistest.Start(b, redistest.Config{}).Client()
	strategy, err := single.New(c)
	require.NoError(b, err)
	run := func(name string, opts ...redlease.Option) {
		benchTake(b, name, strategy, (*redlease.Locker).Lock, opts...)
	}
	run("listening=0/wake=on")
	run("listening=0/wake=off", redlease.WithPolling())

	// Another key, held, with a waiter subscribed to its releases.
	l, err := redlease.New(strategy, redlease.WithTTL(time.Minute))
	require.NoError(b, err)
	held, err := l.TryLock(b.Context(), "wake-bench:held")
	require.NoError(b, err)
	wctx, stop := context.WithCancel(b.Context())
	waiting := make(chan error, 1)
	go func() { _, err := l.Lock(wctx, "wake-bench:held"); waiting <- err }()
	b.Cleanup(func() { stop(); <-waiting; _ = held.Release(context.Background()) })
	time.Sleep(100 * time.Millisecond) // the waiter's first refusal and subscription
	run("listening=1/wake=on")
	run("listening=1/wake=off", redlease.WithPolling())
}
