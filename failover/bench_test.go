package failover_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
			locker := redlease.New(s, redlease.WithTTL(10*time.Second))
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
	run("strategy=single", single.New(c))
	run("strategy=failover", failover.New(redis.UniversalClient(c)))
}
