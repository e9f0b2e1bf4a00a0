package bench_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// watchdogTTL is long enough that no held lock expires during a run.
const watchdogTTL = 10 * time.Minute

// tickNodeTimeout is the quorum node timeout of the watchdog benchmark: a
// tick over 100,000 locks is 200 batch calls per node, which takes longer
// than the default 100 ms on this machine (see the note in
// BenchmarkWatchdog).
const tickNodeTimeout = 10 * time.Second

// acquirers is how many goroutines take the held locks before the runs.
const acquirers = 64

// BenchmarkWatchdog: what one watchdog tick costs. A tick of the renew
// package's Watchdog is one redlease.ExtendAll over the due locks; here it
// runs over all n held locks of a 5-node quorum, for n = 100, 10,000 and
// 100,000. The locks are taken once (concurrently, untimed) and kept across
// runs. Reported per tick (ns/op) and per lock (ns/lock, allocs/lock), with
// the round trips (rtt/node/tick) and script calls (calls/node/tick) each
// node saw per tick.
//
// Peers: lib=redlease-unbatched is the same tick through a strategy wrapper
// that hides ExtendBatch, so each lock is extended on its own (one round
// trip per node per lock); lib=redsync extends each of its mutexes with
// ExtendContext from 64 goroutines at once (redsync has no batch extend; a
// goroutine per lock is how it is kept). The per-lock peers run up to 10,000
// locks: at 100,000 one tick would take tens of seconds.
func BenchmarkWatchdog(b *testing.B) {
	addrs := nodes(b, 5)
	cs := clients(b, addrs)
	q := countRoundTrips(cs)
	s := newQuorum(b, cs, quorum.WithNodeTimeout(tickNodeTimeout))
	locker, err := redlease.New(s, redlease.WithTTL(watchdogTTL))
	require.NoError(b, err)
	unbatched, err := redlease.New(hideBatch{s}, redlease.WithTTL(watchdogTTL))
	require.NoError(b, err)
	peer := redsync.New(pools(cs)...)
	one := clients(b, addrs[:1])
	q1 := countRoundTrips(one)
	strategy, err := single.New(one[0])
	require.NoError(b, err)
	lockerOne, err := redlease.New(strategy, redlease.WithTTL(watchdogTTL))
	require.NoError(b, err)

	key := func(kind string, i int) string { return fmt.Sprintf("bench:%s:watchdog:%s:%d", runID, kind, i) }
	const most = 100_000
	held := heldOnce(b, q, most, func(i int) (*redlease.Lock, error) {
		return locker.TryLock(background, key("quorum", i))
	})
	heldOne := heldOnce(b, q1, most, func(i int) (*redlease.Lock, error) {
		return lockerOne.TryLock(background, key("single", i))
	})
	heldUnbatched := heldOnce(b, q, 100, func(i int) (*redlease.Lock, error) {
		return unbatched.TryLock(background, key("unbatched", i))
	})
	heldPeer := heldOnce(b, q, 10_000, func(i int) (*redsync.Mutex, error) {
		m := peer.NewMutex(key("redsync", i), redsync.WithExpiry(watchdogTTL), redsync.WithTries(1))
		return m, m.LockContext(background)
	})

	for _, n := range []int{1, 100, 10_000, most} {
		b.Run(fmt.Sprintf("lib=redlease/nodes=5/locks=%d", n), func(b *testing.B) {
			tick(b, n, q, addrs, held(b)[:n])
		})
		if n <= 100 {
			b.Run(fmt.Sprintf("lib=redlease-unbatched/nodes=5/locks=%d", n), func(b *testing.B) {
				tick(b, n, q, addrs, heldUnbatched(b)[:n])
			})
		}
		if n <= 10_000 {
			b.Run(fmt.Sprintf("lib=redsync/nodes=5/locks=%d", n), func(b *testing.B) {
				tickPeer(b, n, q, addrs, heldPeer(b)[:n])
			})
		}
		if n >= 100 {
			b.Run(fmt.Sprintf("lib=redlease-single/nodes=1/locks=%d", n), func(b *testing.B) {
				tick(b, n, q1, addrs[:1], heldOne(b)[:n])
			})
		}
	}
}

// tick runs ExtendAll over locks as one op.
func tick(b *testing.B, n int, q *roundTrips, addrs []string, locks []*redlease.Lock) {
	measureTicks(b, n, q, addrs, func() {
		for i, err := range redlease.ExtendAll(background, locks) {
			if err != nil {
				b.Fatalf("lock %d: %v", i, err)
			}
		}
	})
}

// tickPeer extends every redsync mutex once, from acquirers goroutines.
func tickPeer(b *testing.B, n int, q *roundTrips, addrs []string, ms []*redsync.Mutex) {
	measureTicks(b, n, q, addrs, func() {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range min(acquirers, len(ms)) {
			wg.Go(func() {
				for i := next.Add(1) - 1; i < int64(len(ms)); i = next.Add(1) - 1 {
					if ok, err := ms[i].ExtendContext(background); !ok {
						b.Errorf("mutex %d: %v", i, err)
						return
					}
				}
			})
		}
		wg.Wait()
	})
}

// measureTicks times one tick per b.Loop iteration and adds the per-lock
// and per-node figures.
func measureTicks(b *testing.B, n int, q *roundTrips, addrs []string, oneTick func()) {
	b.ReportAllocs()
	oneTick() // untimed: loads the scripts on the nodes, warms the pools
	q.quiesce()
	ticks := 0
	rtt0, calls0 := q.total.Load(), scriptCalls(b, addrs)
	for b.Loop() {
		oneTick()
		ticks++
	}
	b.StopTimer()
	q.quiesce()
	rtt, calls := q.total.Load()-rtt0, scriptCalls(b, addrs)-calls0
	perTick := float64(ticks * len(addrs))
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(ticks*n), "ns/lock")
	b.ReportMetric(float64(rtt)/perTick, "rtt/node/tick")
	b.ReportMetric(float64(calls)/perTick, "calls/node/tick")
}

// heldOnce returns a function that takes n locks with take, from acquirers
// goroutines, the first time it is called (untimed), and returns the same
// locks every time after.
func heldOnce[L any](b *testing.B, q *roundTrips, n int, take func(i int) (L, error)) func(b *testing.B) []L {
	var (
		once  sync.Once
		locks []L
		err   error
	)
	return func(b *testing.B) []L {
		b.StopTimer()
		defer b.StartTimer()
		once.Do(func() {
			start := time.Now()
			locks = make([]L, n)
			var next atomic.Int64
			var mu sync.Mutex
			var wg sync.WaitGroup
			for range min(acquirers, n) {
				wg.Go(func() {
					for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
						lk, e := take(int(i))
						if e != nil {
							mu.Lock()
							err = fmt.Errorf("lock %d of %d: %w", i, n, e)
							mu.Unlock()
							return
						}
						locks[i] = lk
					}
				})
			}
			wg.Wait()
			q.quiesce() // the acquisitions' requests to the nodes that were not waited for
			b.Logf("took %d locks in %v", n, time.Since(start).Round(time.Millisecond))
		})
		if err != nil {
			b.Fatal(err)
		}
		return locks
	}
}

// hideBatch hides a strategy's ExtendBatch, so ExtendAll extends lock by
// lock.
type hideBatch struct{ redlease.Strategy }

// roundTrips counts the round trips (commands and pipelines) some clients
// send, and those still in flight.
type roundTrips struct {
	total, inflight atomic.Int64
}

func countRoundTrips(cs []*redis.Client) *roundTrips {
	q := new(roundTrips)
	for _, c := range cs {
		c.AddHook(roundTripHook{q})
	}
	return q
}

// quiesce waits until no request is in flight (at most 15 s).
func (q *roundTrips) quiesce() {
	for deadline := time.Now().Add(15 * time.Second); q.inflight.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}

type roundTripHook struct{ q *roundTrips }

func (roundTripHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h roundTripHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.q.total.Add(1)
		h.q.inflight.Add(1)
		defer h.q.inflight.Add(-1)
		return next(ctx, cmd)
	}
}

func (h roundTripHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.q.total.Add(1)
		h.q.inflight.Add(1)
		defer h.q.inflight.Add(-1)
		return next(ctx, cmds)
	}
}

// cmdStat is one command's line of INFO commandstats: how often the
// server ran it, and for how long in all.
type cmdStat struct{ calls, usec int64 }

// commandStats reads INFO commandstats at addr, by command name
// ("cmdstat_evalsha"), on a connection of its own that no counter of the
// benchmark sees.
func commandStats(b *testing.B, addr string) map[string]cmdStat {
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.InfoMap(background, "commandstats").Result()
	if err != nil {
		b.Fatalf("INFO commandstats on %s: %v", addr, err)
	}
	stats := make(map[string]cmdStat, len(info["Commandstats"]))
	for cmd, v := range info["Commandstats"] {
		var st cmdStat
		_, _ = fmt.Sscanf(v, "calls=%d,usec=%d", &st.calls, &st.usec)
		stats[cmd] = st
	}
	return stats
}

// scriptCalls sums the script calls (EVAL, EVALSHA) the nodes executed,
// from INFO commandstats.
func scriptCalls(b *testing.B, addrs []string) int64 {
	var total int64
	for _, a := range addrs {
		stats := commandStats(b, a)
		total += stats["cmdstat_evalsha"].calls + stats["cmdstat_eval"].calls
	}
	return total
}
