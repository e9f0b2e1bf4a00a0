package bench_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// BenchmarkSemaphore: a permit of a semaphore of N = 3 taken and
// released per op, sequentially, on quorum/5 (as BenchmarkQuorum; fences
// on, the default, and off) and on one node. Every slot is free at each
// op, so TryAcquire is granted the first slot it tries: the op is one
// lock's acquire and release on a slot key, plus the draw of the slot.
// There is no Go peer to run beside it: redsync and bsm/redislock have no
// semaphore, and Redisson's permit-expirable semaphore has no Go client.
// A refused attempt right after a release (see notObtained) is retried at
// once and counted in the op's time.
func BenchmarkSemaphore(b *testing.B) {
	addrs := nodes(b, 5)
	cs := clients(b, addrs)
	fenced := newQuorum(b, cs)
	unfenced := newQuorum(b, cs, quorum.WithoutFencing())
	one, err := single.New(cs[0])
	require.NoError(b, err)

	b.Run("lib=redlease-fencing/nodes=5", func(b *testing.B) { redleasePermit(b, fenced) })
	b.Run("lib=redlease/nodes=5", func(b *testing.B) { redleasePermit(b, unfenced) })
	b.Run("lib=redlease-fencing/nodes=1", func(b *testing.B) { redleasePermit(b, one) })
}

// redleasePermit: TryAcquire of a permit of N = 3, then its Release, b.N
// times.
func redleasePermit(b *testing.B, s redlease.Strategy) {
	locker, err := redlease.New(s, redlease.WithTTL(quorumTTL))
	require.NoError(b, err)
	sem, err := locker.Semaphore(keyFor(b, "sem"), 3)
	require.NoError(b, err)
	per := make([]time.Duration, 0, b.N)
	retried := 0
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		lk, err := sem.TryAcquire(background)
		for n := 0; err != nil && notObtained(err) && n < maxRetries; n++ {
			retried++
			lk, err = sem.TryAcquire(background)
		}
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Release(background); err != nil {
			b.Fatal(err)
		}
		per = append(per, time.Since(start))
	}
	b.StopTimer()
	reportMedian(b, per)
	b.ReportMetric(float64(retried)/float64(b.N), "retried/op")
}
