package bench_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"

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
func BenchmarkHandoff(b *testing.B) {
	addrs := nodes(b, 5)
	cs := clients(b, addrs)
	one := single.New(cs[0], single.WithoutFencing())
	b.Cleanup(func() { _ = one.Close() })
	q := newQuorum(b, cs, quorum.WithoutFencing())
	rs1, rs5 := redsync.New(pools(cs[:1])...), redsync.New(pools(cs)...)
	rl := redislock.New(cs[0])

	redleaseGrab := func(s redlease.Strategy) func(b *testing.B) {
		return func(b *testing.B) {
			l := redlease.New(s, redlease.WithTTL(handoffTTL))
			key := keyFor(b)
			handoff(b, func(ctx context.Context) (func(context.Context) error, error) {
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
			handoff(b, func(ctx context.Context) (func(context.Context) error, error) {
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
		handoff(b, func(ctx context.Context) (func(context.Context) error, error) {
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
// both take it with g.
func handoff(b *testing.B, g grab) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	type got struct {
		release func(context.Context) error
		err     error
		at      time.Time
	}
	per := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		release, err := g(ctx)
		if err != nil {
			b.Fatal(err)
		}
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
	slices.Sort(per)
	b.ReportMetric(float64(per[len(per)/2].Nanoseconds()), "p50-handoff-ns")
	b.ReportMetric(float64(per[min(len(per)-1, len(per)*99/100)].Nanoseconds()), "p99-handoff-ns")
}
