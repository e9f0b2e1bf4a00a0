package bench_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
)

// quorumTTL is the lock TTL of every quorum benchmark, for both libraries.
const quorumTTL = 10 * time.Second

// parallelGoroutines is how many goroutines the parallel cases run
// (rounded up to a multiple of GOMAXPROCS).
const parallelGoroutines = 16

func newQuorum(b *testing.B, cs []*redis.Client, opts ...quorum.Option) *quorum.Strategy {
	b.Helper()
	s, err := quorum.New(universal(cs), opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	return s
}

// BenchmarkQuorum: one acquire and one release of one key per op, on five
// nodes, redlease's quorum strategy (majority, 100 ms node timeout; fences
// off, like for like, except in lib=redlease-fencing, which is the
// default) beside redsync (defaults but WithTries(1), so that both make one
// attempt; both hold the key for quorumTTL).
//
// Every case takes the key again right after releasing it. An attempt
// refused then (by nodes whose delete has not landed yet; see
// notObtained) is tried again at once, counted in the op's time and
// reported as retried/op.
//
// Direct cases connect straight to the nodes. The slow=, down= cases put all
// five nodes behind proxies (so both libraries pay the same extra hop), then
// delay node 4's replies by 20 ms, or make it refuse connections. The
// latency=1ms cases delay every node's replies by 1 ms and report rtt/op:
// the op's time in those milliseconds, about its round trips in a row.
func BenchmarkQuorum(b *testing.B) {
	addrs := nodes(b, 5)
	direct := clients(b, addrs)
	px := startProxies(b, addrs)
	proxied := clients(b, px.Addrs)
	inflight := countInflight(proxied)

	ours := newQuorum(b, direct, quorum.WithoutFencing()) // like for like: redsync has no fences
	oursFenced := newQuorum(b, direct)                    // the default
	oursProxied := newQuorum(b, proxied, quorum.WithoutFencing())
	oursFencedProxied := newQuorum(b, proxied)
	peer := redsync.New(pools(direct)...)
	peerProxied := redsync.New(pools(proxied)...)

	b.Run("lib=redlease/nodes=5", func(b *testing.B) { redleaseSeq(b, ours) })
	b.Run("lib=redlease-fencing/nodes=5", func(b *testing.B) { redleaseSeq(b, oursFenced) })
	b.Run("lib=redsync/nodes=5", func(b *testing.B) { redsyncSeq(b, peer) })

	par := "/parallel=" + strconv.Itoa(parallelism()*runtime.GOMAXPROCS(0))
	b.Run("lib=redlease/nodes=5"+par, func(b *testing.B) { redleasePar(b, ours) })
	b.Run("lib=redlease-fencing/nodes=5"+par, func(b *testing.B) { redleasePar(b, oursFenced) })
	b.Run("lib=redsync/nodes=5"+par, func(b *testing.B) { redsyncPar(b, peer) })

	const slow = 4 // the node that is slowed down or cut
	faults := []struct {
		name       string
		set, unset func()
	}{
		{"slow=0", func() {}, func() {}},
		{"slow=1", func() { px.Latency(b, slow, 20) }, func() { px.Heal(b, slow) }},
		{"down=1", func() { px.Cut(b, slow) }, func() { px.Heal(b, slow) }},
	}
	for _, f := range faults {
		f.set()
		b.Run("lib=redlease/nodes=5/"+f.name, func(b *testing.B) {
			defer settle(b, inflight)
			redleaseSeq(b, oursProxied)
		})
		b.Run("lib=redsync/nodes=5/"+f.name, func(b *testing.B) {
			defer settle(b, inflight)
			redsyncSeq(b, peerProxied)
		})
		b.Run("lib=redsync-failfast/nodes=5/"+f.name, func(b *testing.B) {
			defer settle(b, inflight)
			redsyncSeq(b, peerProxied, redsync.WithFailFast(true))
		})
		f.unset()
		// A node the clients could not dial is back, but go-redis keeps
		// answering with the last dial error for up to about a second
		// after it (its dial circuit breaker): the next case starts once
		// every proxied client answers a PING again.
		awaitPing(b, proxied)
	}

	// Every node's replies 1 ms late, as across zones: round trips dominate,
	// and an op's time over one round trip's is about its round trips in a
	// row (rtt/op). One round trip is the median PING through the same
	// proxies, measured before each case: a 1 ms sleep overshoots on a
	// busy machine, and the op pays the same overshoot.
	for i := range px.Addrs {
		px.Latency(b, i, 1)
	}
	rtts := func(b *testing.B, one time.Duration) {
		b.ReportMetric(float64(b.Elapsed())/float64(b.N)/float64(one), "rtt/op")
		b.ReportMetric(float64(one.Nanoseconds()), "rtt-ns")
	}
	roundTrip := func(b *testing.B) time.Duration {
		per := make([]time.Duration, 0, 51)
		for i := range cap(per) {
			start := time.Now()
			if err := proxied[i%len(proxied)].Ping(background).Err(); err != nil {
				b.Fatal(err)
			}
			per = append(per, time.Since(start))
		}
		slices.Sort(per)
		return per[len(per)/2]
	}
	for _, c := range []struct {
		name string
		run  func(b *testing.B)
	}{
		{"lib=redlease-fencing", func(b *testing.B) { redleaseSeq(b, oursFencedProxied) }},
		{"lib=redlease", func(b *testing.B) { redleaseSeq(b, oursProxied) }},
		{"lib=redsync", func(b *testing.B) { redsyncSeq(b, peerProxied) }},
	} {
		b.Run(c.name+"/nodes=5/latency=1ms", func(b *testing.B) {
			defer settle(b, inflight)
			one := roundTrip(b)
			b.ResetTimer()
			c.run(b)
			rtts(b, one)
		})
	}
	for i := range px.Addrs {
		px.Heal(b, i)
	}
}

// awaitPing waits until every client answers a PING, the clients in turn:
// within 10 s, widened by 3 × the stall this run measured meanwhile
// (probe.WaitFor).
func awaitPing(b *testing.B, cs []*redis.Client) {
	b.Helper()
	probe := redistest.StartStallProbe(b)
	defer probe.Stop()
	i := 0 // cs[:i] have answered
	var last error
	probe.WaitFor(b, 10*time.Second, 3, 20*time.Millisecond, func() bool {
		for ; i < len(cs); i++ {
			if last = cs[i].Ping(background).Err(); last != nil {
				return false
			}
		}
		return true
	}, "a client still fails its PING after a heal: %s", redistest.Lazy(func() string {
		return fmt.Sprintf("client %d: %v", i, last)
	}))
}

// settle reports how many requests a run left in flight when its last op
// returned ("stragglers": requests to the slow or dead node that the library
// did not wait for), then waits, untimed, until they are done, so that they
// do not slow down the next run. Ours and redsync WithFailFast leave some;
// how many is part of their cost.
func settle(b *testing.B, inflight *atomic.Int64) {
	b.StopTimer()
	b.ReportMetric(float64(inflight.Load()), "stragglers")
	deadline := time.Now().Add(15 * time.Second)
	for inflight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

// countInflight counts the commands in flight on cs.
func countInflight(cs []*redis.Client) *atomic.Int64 {
	n := new(atomic.Int64)
	for _, c := range cs {
		c.AddHook(inflightHook{n})
	}
	return n
}

type inflightHook struct{ n *atomic.Int64 }

func (inflightHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h inflightHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		defer h.n.Add(-1)
		return next(ctx, cmd)
	}
}

func (h inflightHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		defer h.n.Add(-1)
		return next(ctx, cmds)
	}
}

// parallelism is the b.SetParallelism factor that gives parallelGoroutines.
func parallelism() int {
	p := runtime.GOMAXPROCS(0)
	return (parallelGoroutines + p - 1) / p
}

// redleaseSeq: TryLock then Release of one key, b.N times.
func redleaseSeq(b *testing.B, s redlease.Strategy) {
	locker, err := redlease.New(s, redlease.WithTTL(quorumTTL))
	require.NoError(b, err)
	key := keyFor(b)
	per := make([]time.Duration, 0, b.N)
	retried := 0
	var relfail atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		lk, err := locker.TryLock(background, key)
		for n := 0; err != nil && notObtained(err) && n < maxRetries; n++ {
			retried++
			lk, err = locker.TryLock(background, key)
		}
		if err != nil {
			b.Fatal(err)
		}
		if err := lk.Release(background); err != nil {
			key = releaseFailed(b, &relfail, err)
		}
		per = append(per, time.Since(start))
	}
	b.StopTimer()
	reportMedian(b, per)
	b.ReportMetric(float64(retried)/float64(b.N), "retried/op")
	reportReleaseFailures(b, relfail.Load())
}

// redsyncSeq: LockContext (one try) then UnlockContext of one mutex, b.N
// times.
func redsyncSeq(b *testing.B, rs *redsync.Redsync, opts ...redsync.Option) {
	opts = append([]redsync.Option{redsync.WithExpiry(quorumTTL), redsync.WithTries(1)}, opts...)
	m := rs.NewMutex(keyFor(b), opts...)
	per := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	retried := 0
	var relfail atomic.Int64
	for range b.N {
		start := time.Now()
		err := m.LockContext(background)
		for n := 0; err != nil && redsyncNotObtained(err) && n < maxRetries; n++ {
			retried++
			err = m.LockContext(background)
		}
		if err != nil {
			b.Fatal(err)
		}
		if ok, err := m.UnlockContext(background); !ok {
			m = rs.NewMutex(releaseFailed(b, &relfail, err), opts...)
		}
		per = append(per, time.Since(start))
	}
	b.StopTimer()
	reportMedian(b, per)
	b.ReportMetric(float64(retried)/float64(b.N), "retried/op")
	reportReleaseFailures(b, relfail.Load())
}

// releaseFailed counts a release that did not reach a majority (on a busy
// machine a node's reply can miss the 100 ms node timeout) and returns a
// fresh key for the next op: the old one stays taken until its TTL.
func releaseFailed(b *testing.B, n *atomic.Int64, err error) string {
	b.Logf("release failed, going on with a fresh key: %v", err)
	return keyFor(b, "after-failed-release", strconv.FormatInt(n.Add(1), 10))
}

// reportReleaseFailures reports failed releases per op (relfail/op) and
// fails the run when more than 1 % of its releases failed: then the
// figures measure the machine or a broken release, not the library.
func reportReleaseFailures(b *testing.B, n int64) {
	b.ReportMetric(float64(n)/float64(b.N), "relfail/op")
	if n*100 > int64(b.N) {
		b.Fatalf("%d of %d releases failed", n, b.N)
	}
}

// maxRetries bounds how often one op tries again at once after an
// attempt that was not obtained.
const maxRetries = 1000

// notObtained reports whether a TryLock was not obtained: refused, or
// undecided (ErrUnavailable, when a node that timed out decided it). A
// Release returns once a majority deleted the key (ours, and redsync's
// WithFailFast), so an acquisition sent at once can find the key still on
// nodes whose delete has not landed (see the quorum package
// documentation); with the slow=1 node timing out as well, that is
// "unavailable" rather than "taken". Every case tries again at once (the
// failed attempt's time counts in the op, up to a node timeout) and
// reports how often as retried/op, instead of failing the run; a case
// that keeps failing still fails after maxRetries tries.
func notObtained(err error) bool {
	return errors.Is(err, redlease.ErrNotObtained) || errors.Is(err, redlease.ErrUnavailable)
}

// redsyncNotObtained is notObtained for redsync's LockContext with one try.
func redsyncNotObtained(err error) bool {
	var taken *redsync.ErrTaken
	return errors.Is(err, redsync.ErrFailed) || errors.As(err, &taken)
}

// redleasePar: the same from parallelGoroutines goroutines, each on its own
// key, sharing one Locker (it is safe for concurrent use).
func redleasePar(b *testing.B, s redlease.Strategy) {
	locker, err := redlease.New(s, redlease.WithTTL(quorumTTL))
	require.NoError(b, err)
	var id, retried, relfail atomic.Int64
	b.SetParallelism(parallelism())
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		key := keyFor(b, strconv.FormatInt(id.Add(1), 10))
		for pb.Next() {
			lk, err := locker.TryLock(background, key)
			for n := 0; err != nil && notObtained(err) && n < maxRetries; n++ {
				retried.Add(1)
				lk, err = locker.TryLock(background, key)
			}
			if err != nil {
				b.Error(err)
				return
			}
			if err := lk.Release(background); err != nil {
				key = releaseFailed(b, &relfail, err)
			}
		}
	})
	b.ReportMetric(float64(retried.Load())/float64(b.N), "retried/op")
	reportReleaseFailures(b, relfail.Load())
}

// redsyncPar: one Mutex per goroutine (a redsync Mutex is not safe for
// concurrent use), each on its own key, on one shared Redsync.
func redsyncPar(b *testing.B, rs *redsync.Redsync) {
	var id, retried, relfail atomic.Int64
	b.SetParallelism(parallelism())
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		m := rs.NewMutex(keyFor(b, strconv.FormatInt(id.Add(1), 10)), redsync.WithExpiry(quorumTTL), redsync.WithTries(1))
		for pb.Next() {
			err := m.LockContext(background)
			for n := 0; err != nil && redsyncNotObtained(err) && n < maxRetries; n++ {
				retried.Add(1)
				err = m.LockContext(background)
			}
			if err != nil {
				b.Error(err)
				return
			}
			if ok, err := m.UnlockContext(background); !ok {
				m = rs.NewMutex(releaseFailed(b, &relfail, err), redsync.WithExpiry(quorumTTL), redsync.WithTries(1))
			}
		}
	})
	b.ReportMetric(float64(retried.Load())/float64(b.N), "retried/op")
	reportReleaseFailures(b, relfail.Load())
}
