package bench_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// Handoff timing: the waiter starts waiting, and the holder releases a
// random time later, drawn uniformly from [handoffMinHold, handoffMaxHold):
// the waiter is then at a random point of its retry schedule.
const (
	handoffMinHold = 5 * time.Millisecond
	handoffMaxHold = 155 * time.Millisecond
	handoffTTL     = 10 * time.Second
)

// grab takes the lock (a waiter: with the library's own retry policy) and
// returns its release.
type grab func(ctx context.Context) (release func(context.Context) error, err error)

// BenchmarkHandoff: how long a released lock sits before the next waiter
// has it. One op: a holder takes the key, a waiter starts its blocking
// Lock, the holder releases at a random point of the waiter's wait; the
// handoff is from the holder's Release returning to the waiter's Lock
// returning. Reported as p50-handoff-ns and p99-handoff-ns (ns/op is
// mostly the random hold). Each library waits with its default retry
// policy — redlease: a release notice, else backoff 10–320 ms; redsync:
// 50–250 ms, 32 tries; redislock has no retry by default (NoRetry), so it
// gets the LinearBackoff(100 ms) of its own README — and fences off
// (like for like, as in BenchmarkQuorum).
//
// The bound is one uncontended acquisition plus two round trips
// (the waiter hears of the release, then acquires once). Each op also
// times the holder's own acquisition (the key is free then: uncontended)
// and one PING to node 0, and reports p50-acquire-ns, p50-rtt-ns and
// p50/bound = p50-handoff-ns ÷ (p50-acquire-ns + 2·p50-rtt-ns): at most 1
// meets the bound.
func BenchmarkHandoff(b *testing.B) {
	addrs := nodes(b, 5)
	cs := clients(b, addrs)
	one, err := single.New(cs[0], single.WithoutFencing())
	require.NoError(b, err)
	b.Cleanup(func() { _ = one.Close() })
	q := newQuorum(b, cs, quorum.WithoutFencing())
	rs1, rs5 := redsync.New(pools(cs[:1])...), redsync.New(pools(cs)...)
	rl := redislock.New(cs[0])
	ping := func(ctx context.Context) error { return cs[0].Ping(ctx).Err() }

	redleaseGrab := func(s redlease.Strategy) func(b *testing.B) {
		return func(b *testing.B) {
			l, err := redlease.New(s, redlease.WithTTL(handoffTTL))
			require.NoError(b, err)
			key := keyFor(b)
			handoff(b, ping, func(ctx context.Context) (func(context.Context) error, error) {
				lk, err := l.Lock(ctx, key)
				if err != nil {
					return nil, err
				}
				return lk.Release, nil
			})
		}
	}
	redsyncGrab := func(rs *redsync.Redsync) func(b *testing.B) {
		return func(b *testing.B) {
			key := keyFor(b)
			handoff(b, ping, func(ctx context.Context) (func(context.Context) error, error) {
				m := rs.NewMutex(key, redsync.WithExpiry(handoffTTL))
				if err := m.LockContext(ctx); err != nil {
					return nil, err
				}
				return func(ctx context.Context) error { _, err := m.UnlockContext(ctx); return err }, nil
			})
		}
	}
	b.Run("lib=redlease/nodes=1", redleaseGrab(one))
	b.Run("lib=redislock/nodes=1", func(b *testing.B) {
		key := keyFor(b)
		handoff(b, ping, func(ctx context.Context) (func(context.Context) error, error) {
			lk, err := rl.Obtain(ctx, key, handoffTTL, &redislock.Options{RetryStrategy: redislock.LinearBackoff(100 * time.Millisecond)})
			if err != nil {
				return nil, err
			}
			return lk.Release, nil
		})
	})
	b.Run("lib=redsync/nodes=1", redsyncGrab(rs1))
	b.Run("lib=redlease/nodes=5", redleaseGrab(q))
	b.Run("lib=redsync/nodes=5", redsyncGrab(rs5))
}

// handoff runs b.N handoffs of one key between a holder and a waiter that
// both take it with g; ping is one round trip to a node.
func handoff(b *testing.B, ping func(context.Context) error, g grab) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	type got struct {
		release func(context.Context) error
		err     error
		at      time.Time
	}
	per := make([]time.Duration, 0, b.N)
	acquire := make([]time.Duration, 0, b.N)
	rtt := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := ping(ctx); err != nil {
			b.Fatal(err)
		}
		rtt = append(rtt, time.Since(start))
		start = time.Now()
		release, err := g(ctx)
		if err != nil {
			b.Fatal(err)
		}
		acquire = append(acquire, time.Since(start))
		done := make(chan got, 1)
		go func() {
			r, err := g(ctx)
			done <- got{r, err, time.Now()}
		}()
		time.Sleep(handoffMinHold + rand.N(handoffMaxHold-handoffMinHold))
		if err := release(ctx); err != nil {
			b.Fatal(err)
		}
		released := time.Now()
		w := <-done
		if w.err != nil {
			b.Fatal(w.err)
		}
		per = append(per, max(0, w.at.Sub(released)))
		if err := w.release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	p50, acq, trip := median(per), median(acquire), median(rtt)
	b.ReportMetric(float64(p50.Nanoseconds()), "p50-handoff-ns")
	b.ReportMetric(float64(per[min(len(per)-1, len(per)*99/100)].Nanoseconds()), "p99-handoff-ns")
	b.ReportMetric(float64(acq.Nanoseconds()), "p50-acquire-ns")
	b.ReportMetric(float64(trip.Nanoseconds()), "p50-rtt-ns")
	b.ReportMetric(float64(p50)/float64(acq+2*trip), "p50/bound")
}

// median sorts ds and returns its middle element.
func median(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)/2]
}
