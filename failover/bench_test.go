package failover_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/single"
)

// BenchmarkAcquireRelease compares, on the same primary (with one replica)
// in one run, single and failover: the difference is the WAIT in the same
// round trip, i.e. one replication round.
func BenchmarkAcquireRelease(b *testing.B) {
	primary := redistest.Start(b, redistest.Config{})
	redistest.StartReplica(b, primary, redistest.Config{})
	c := primary.Client()
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
	run("strategy=single", strategy)
	strategy2, err := failover.New(redis.UniversalClient(c))
	require.NoError(b, err)
	run("strategy=failover", strategy2)
}
