package renew_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
)

// BenchmarkWatchdogTick measures what one watchdog tick costs: extending
// every kept lock once (redlease.ExtendAll, which is what a tick runs), on
// five real quorum nodes, reported per renewed lock. Batching should make
// the cost per lock fall as the number of locks grows.
func BenchmarkWatchdogTick(b *testing.B) {
	servers := redistest.StartN(b, 5, redistest.Config{})
	clients := make([]redis.UniversalClient, len(servers))
	for i, srv := range servers {
		clients[i] = srv.Client()
	}
	s, err := quorum.New(clients, quorum.WithNodeTimeout(5*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	locker, err := redlease.New(s, redlease.WithTTL(5*time.Minute))
	require.NoError(b, err)

	for _, n := range []int{100, 1_000, 10_000} {
		b.Run(fmt.Sprintf("locks=%d", n), func(b *testing.B) { tick(b, locker, n) })
	}
	// The same tick without batching: the strategy hidden behind a wrapper
	// that is not a BatchExtender, so each lock is extended on its own.
	b.Run("locks=100/batched=false", func(b *testing.B) {
		locker2, err := redlease.New(unbatched{s}, redlease.WithTTL(5*time.Minute))
		require.NoError(b, err)
		tick(b, locker2, 100)
	})
}

// tick takes n locks through locker and measures one ExtendAll over them,
// reported per lock.
func tick(b *testing.B, locker *redlease.Locker, n int) {
	ctx := context.Background()
	locks := make([]*redlease.Lock, n)
	for i := range locks {
		lk, err := locker.Lock(ctx, fmt.Sprintf("%s:%d", b.Name(), i), redlease.WithMaxAttempts(5))
		if err != nil {
			b.Fatal(err)
		}
		locks[i] = lk
	}
	b.Cleanup(func() {
		for _, lk := range locks {
			_ = lk.Release(ctx)
		}
	})
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for i, err := range redlease.ExtendAll(ctx, locks) {
			if err != nil {
				b.Fatalf("lock %d: %v", i, err)
			}
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/lock")
}

// unbatched hides a strategy's ExtendBatch.
type unbatched struct{ redlease.Strategy }
