package quorum_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
)

// acquireRelease is the workload every quorum benchmark runs: one TryLock
// and one Release on one key, timed per operation so the median can be
// reported beside the mean.
func acquireRelease(b *testing.B, s redlease.Strategy) {
	locker, err := redlease.New(s, redlease.WithTTL(10*time.Second))
	require.NoError(b, err)
	ctx := context.Background()
	key := b.Name()
	per := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		lk, err := locker.TryLock(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Release(ctx); err != nil {
			b.Fatal(err)
		}
		per = append(per, time.Since(start))
	}
	b.StopTimer()
	reportMedian(b, per)
}

func reportMedian(b *testing.B, per []time.Duration) {
	slices.Sort(per)
	b.ReportMetric(float64(per[len(per)/2].Nanoseconds()), "p50-ns/op")
}

func benchStrategy(b *testing.B, clients []redis.UniversalClient, opts ...quorum.Option) *quorum.Strategy {
	s, err := quorum.New(clients, opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// BenchmarkAcquireRelease: one lock and one unlock per op on five real
// nodes, with and without fencing. The comparison with redsync on the same
// nodes is bench's BenchmarkQuorum (the bench module, where the peers are).
func BenchmarkAcquireRelease(b *testing.B) {
	servers := redistest.StartN(b, 5, redistest.Config{})
	clients := make([]redis.UniversalClient, len(servers))
	for i, srv := range servers {
		clients[i] = srv.Client()
	}

	b.Run("lib=redlease/nodes=5", func(b *testing.B) {
		acquireRelease(b, benchStrategy(b, clients))
	})
	b.Run("lib=redlease/nodes=5/fencing", func(b *testing.B) {
		acquireRelease(b, benchStrategy(b, clients, quorum.WithFencing()))
	})
}

// BenchmarkSlowNode runs the same workload with five nodes behind
// in-process gates, first all fast, then with one node's replies delayed
// by 20 ms. Acquire and Release return at a majority, so the two should cost
// about the same.
func BenchmarkSlowNode(b *testing.B) {
	servers := redistest.StartN(b, 5, redistest.Config{})
	gates := make([]*redistest.Gate, len(servers))
	clients := make([]redis.UniversalClient, len(servers))
	for i, srv := range servers {
		gates[i] = redistest.NewGate(b, srv.Addr)
		clients[i] = gates[i].Client()
	}
	s := benchStrategy(b, clients)

	b.Run("nodes=5/slow=0", func(b *testing.B) { acquireRelease(b, s) })
	gates[4].Delay(20 * time.Millisecond)
	b.Run("nodes=5/slow=1", func(b *testing.B) { acquireRelease(b, s) })
	gates[4].Heal()
}
