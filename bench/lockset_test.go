package bench_test

import (
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// BenchmarkLockSet: two keys taken together and released together per op
// (a transfer's two accounts), sequentially, on quorum/5 (as
// BenchmarkQuorum) and on one node. redlease's TryLockAll + Release
// (fences on, the default, and off) beside redsync taking two mutexes one
// by one (Lock, Lock, then Unlock, Unlock; WithTries(1), like for like),
// on quorum/5 only: redsync has no one-node lock of its own beyond a
// quorum of one, which is what its one-node case runs. A refused attempt
// right after a release (see notObtained) is retried at once and counted
// in the op's time.
func BenchmarkLockSet(b *testing.B) {
	addrs := nodes(b, 5)
	cs := clients(b, addrs)
	fenced := newQuorum(b, cs)
	unfenced := newQuorum(b, cs, quorum.WithoutFencing())
	one, err := single.New(cs[0])
	require.NoError(b, err)
	peer := redsync.New(pools(cs)...)
	peerOne := redsync.New(pools(cs[:1])...)

	b.Run("lib=redlease-fencing/nodes=5", func(b *testing.B) { redleaseSet(b, fenced) })
	b.Run("lib=redlease/nodes=5", func(b *testing.B) { redleaseSet(b, unfenced) })
	b.Run("lib=redsync/nodes=5", func(b *testing.B) { redsyncSet(b, peer) })
	b.Run("lib=redlease-fencing/nodes=1", func(b *testing.B) { redleaseSet(b, one) })
	b.Run("lib=redsync/nodes=1", func(b *testing.B) { redsyncSet(b, peerOne) })
}

// redleaseSet: TryLockAll of two keys, then Release of the set, b.N times.
func redleaseSet(b *testing.B, s redlease.Strategy) {
	locker, err := redlease.New(s, redlease.WithTTL(quorumTTL))
	require.NoError(b, err)
	keys := []string{keyFor(b, "to"), keyFor(b, "from")}
	per := make([]time.Duration, 0, b.N)
	retried := 0
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		set, err := locker.TryLockAll(background, keys)
		for n := 0; err != nil && notObtained(err) && n < maxRetries; n++ {
			retried++
			set, err = locker.TryLockAll(background, keys)
		}
		if err != nil {
			b.Fatal(err)
		}
		if err := set.Release(background); err != nil {
			b.Fatal(err)
		}
		per = append(per, time.Since(start))
	}
	b.StopTimer()
	reportMedian(b, per)
	b.ReportMetric(float64(retried)/float64(b.N), "retried/op")
}

// redsyncSet: two mutexes locked one after the other (in one fixed order)
// and unlocked, b.N times.
func redsyncSet(b *testing.B, rs *redsync.Redsync) {
	opts := []redsync.Option{redsync.WithExpiry(quorumTTL), redsync.WithTries(1)}
	ms := []*redsync.Mutex{rs.NewMutex(keyFor(b, "from"), opts...), rs.NewMutex(keyFor(b, "to"), opts...)}
	per := make([]time.Duration, 0, b.N)
	retried := 0
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		for _, m := range ms {
			err := m.LockContext(background)
			for n := 0; err != nil && redsyncNotObtained(err) && n < maxRetries; n++ {
				retried++
				err = m.LockContext(background)
			}
			if err != nil {
				b.Fatal(err)
			}
		}
		for i := len(ms) - 1; i >= 0; i-- {
			if ok, err := ms[i].UnlockContext(background); !ok {
				b.Fatal(err)
			}
		}
		per = append(per, time.Since(start))
	}
	b.StopTimer()
	reportMedian(b, per)
	b.ReportMetric(float64(retried)/float64(b.N), "retried/op")
}
