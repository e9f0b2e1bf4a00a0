package bench_test

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease/idempotency"
)

// result is what every handler returns: a small JSON body.
var result = []byte(`{"id":"pay_123456","status":"captured","amount":1250,"currency":"EUR"}`)

// handler is every benchmark's handler: it returns result.
func handler(context.Context, uint64) ([]byte, error) { return result, nil }

// idempotencySetup starts one node and returns its address, a Barrier on
// it with its defaults, and the raw floor on the same client.
func idempotencySetup(b *testing.B) (string, *idempotency.Barrier, rawBarrier) {
	addr := nodes(b, 1)[0]
	c := newClient(b, addr)
	barrier, err := idempotency.New(c, idempotency.WithPrefix("bench:"+runID+":idem:"))
	if err != nil {
		b.Fatal(err)
	}
	return addr, barrier, rawBarrier{c: c, prefix: "bench:" + runID + ":raw:"}
}

// firstKeys numbers the keys of first requests across runs, so each is new.
var firstKeys atomic.Int64

// BenchmarkIdempotency: the barrier (idempotency.New on one node, its
// defaults: single-strategy lock on the store, 30 s lease, 24 h retention)
// beside a raw floor that gives the same three answers with the fewest
// round trips a hand-written version can have — one SET NX GET that either
// claims the key or returns what is there, then a SET of the result. The
// floor has no fingerprints, fences, owner checks or takeover of a crashed
// owner's request; the barrier has all of them.
//
// server-us/op is the time the store spent executing each request's
// commands (INFO commandstats): the part of ns/op that is the server's,
// which the client's work and the round trips do not blur.
//
//	case=first     a new key: the handler runs and its result is stored
//	case=replay    a completed key: the stored result comes back
//	case=conflict  a key whose first request is still running: ErrInProgress
func BenchmarkIdempotency(b *testing.B) {
	addr, barrier, raw := idempotencySetup(b)

	b.Run("lib=redlease/case=first", func(b *testing.B) {
		b.ReportAllocs()
		defer reportServerTime(b, addr, serverUsec(b, addr))
		for b.Loop() {
			key := "first:" + strconv.FormatInt(firstKeys.Add(1), 10)
			out, err := barrier.Do(background, idempotency.Request{Key: key}, handler)
			if err != nil || out.Replayed {
				b.Fatal(out, err)
			}
		}
	})
	b.Run("lib=raw/case=first", func(b *testing.B) {
		b.ReportAllocs()
		defer reportServerTime(b, addr, serverUsec(b, addr))
		for b.Loop() {
			key := "first:" + strconv.FormatInt(firstKeys.Add(1), 10)
			if _, replayed, err := raw.do(background, key, handler); err != nil || replayed {
				b.Fatal(replayed, err)
			}
		}
	})

	b.Run("lib=redlease/case=replay", func(b *testing.B) {
		req := idempotency.Request{Key: "replay"}
		if _, err := barrier.Do(background, req, handler); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		defer reportServerTime(b, addr, serverUsec(b, addr))
		for b.Loop() {
			out, err := barrier.Do(background, req, handler)
			if err != nil || !out.Replayed {
				b.Fatal(out, err)
			}
		}
	})
	b.Run("lib=raw/case=replay", func(b *testing.B) {
		if _, _, err := raw.do(background, "replay", handler); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		defer reportServerTime(b, addr, serverUsec(b, addr))
		for b.Loop() {
			if _, replayed, err := raw.do(background, "replay", handler); err != nil || !replayed {
				b.Fatal(replayed, err)
			}
		}
	})

	b.Run("lib=redlease/case=conflict", func(b *testing.B) {
		req := idempotency.Request{Key: "conflict:" + strconv.FormatInt(firstKeys.Add(1), 10)}
		stop := holdInFlight(b, func(h idempotency.Handler) error {
			_, err := barrier.Do(background, req, h)
			return err
		})
		defer stop()
		b.ReportAllocs()
		defer reportServerTime(b, addr, serverUsec(b, addr))
		for b.Loop() {
			if _, err := barrier.Do(background, req, handler); !errors.Is(err, idempotency.ErrInProgress) {
				b.Fatal(err)
			}
		}
	})
	b.Run("lib=raw/case=conflict", func(b *testing.B) {
		key := "conflict:" + strconv.FormatInt(firstKeys.Add(1), 10)
		stop := holdInFlight(b, func(h idempotency.Handler) error {
			_, _, err := raw.do(background, key, h)
			return err
		})
		defer stop()
		b.ReportAllocs()
		defer reportServerTime(b, addr, serverUsec(b, addr))
		for b.Loop() {
			if _, _, err := raw.do(background, key, handler); !errors.Is(err, idempotency.ErrInProgress) {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkIdempotencyPaired is BenchmarkIdempotency's first request and
// replay with the barrier and the floor interleaved op by op, on the same
// node and client: each op runs one request of each, in alternating order,
// and times each. So a noisy moment of the machine (on a small VM they come
// and go within a second, and two sub-benchmarks a second apart can differ
// by a fifth) hits both alike, and the ratio is taken on the same moments.
//
// The name says how many CPUs the process may use (cpus=, from its
// affinity at start): `make bench` runs it twice, once pinned to one CPU
// with the server (cpus=1: each request's server time adds to the
// client's, and the server's Lua runs with caches the client just used,
// so this weighs the store's CPU per request) and once unpinned (cpus=2:
// client and server on their own CPUs, as with a store on another
// machine, and a round trip costs a wakeup across CPUs). Pairing keeps
// the unpinned run's ratio steady where BenchmarkIdempotency's is not.
// ns/op is the pair's; the metrics are per request:
//
//	ours-p50-us, raw-p50-us   median time of one request, µs
//	p50-ratio                 ours-p50-us / raw-p50-us
//	mean-ratio                all of ours' time / all of the floor's
//	p90-ratio                 the same at the 90th percentile
func BenchmarkIdempotencyPaired(b *testing.B) {
	_, barrier, raw := idempotencySetup(b)

	cpus := "cpus=" + strconv.Itoa(runtime.NumCPU())
	b.Run(cpus+"/case=first", func(b *testing.B) {
		pairedLoop(b, func(int) {
			key := "first:" + strconv.FormatInt(firstKeys.Add(1), 10)
			out, err := barrier.Do(background, idempotency.Request{Key: key}, handler)
			if err != nil || out.Replayed {
				b.Fatal(out, err)
			}
		}, func(int) {
			key := "first:" + strconv.FormatInt(firstKeys.Add(1), 10)
			if _, replayed, err := raw.do(background, key, handler); err != nil || replayed {
				b.Fatal(replayed, err)
			}
		})
	})
	b.Run(cpus+"/case=replay", func(b *testing.B) {
		req := idempotency.Request{Key: "paired-replay"}
		if _, err := barrier.Do(background, req, handler); err != nil {
			b.Fatal(err)
		}
		if _, _, err := raw.do(background, req.Key, handler); err != nil {
			b.Fatal(err)
		}
		pairedLoop(b, func(int) {
			out, err := barrier.Do(background, req, handler)
			if err != nil || !out.Replayed {
				b.Fatal(out, err)
			}
		}, func(int) {
			if _, replayed, err := raw.do(background, req.Key, handler); err != nil || !replayed {
				b.Fatal(replayed, err)
			}
		})
	})
}

// pairedLoop runs ours and floor once each per op, alternating which goes
// first, times each, and reports the pair's metrics (reportPaired); i
// counts the ops from 0.
func pairedLoop(b *testing.B, ours, floor func(i int)) {
	var mine, theirs []time.Duration
	i := 0
	for b.Loop() {
		if i%2 == 0 {
			t0 := time.Now()
			ours(i)
			t1 := time.Now()
			floor(i)
			mine, theirs = append(mine, t1.Sub(t0)), append(theirs, time.Since(t1))
		} else {
			t0 := time.Now()
			floor(i)
			t1 := time.Now()
			ours(i)
			theirs, mine = append(theirs, t1.Sub(t0)), append(mine, time.Since(t1))
		}
		i++
	}
	reportPaired(b, mine, theirs)
}

// reportPaired reports BenchmarkIdempotencyPaired's metrics from the
// times of ours and the floor's requests, one of each per op.
func reportPaired(b *testing.B, ours, floor []time.Duration) {
	if len(ours) == 0 || len(floor) == 0 {
		return
	}
	total := func(ds []time.Duration) (t time.Duration) {
		for _, d := range ds {
			t += d
		}
		return t
	}
	mean := float64(total(ours)) / float64(total(floor))
	ours50, floor50 := median(ours), median(floor) // sorts both
	p90 := func(ds []time.Duration) time.Duration { return ds[min(len(ds)-1, len(ds)*90/100)] }
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	b.ReportMetric(us(ours50), "ours-p50-us")
	b.ReportMetric(us(floor50), "raw-p50-us")
	b.ReportMetric(float64(ours50)/float64(floor50), "p50-ratio")
	b.ReportMetric(mean, "mean-ratio")
	b.ReportMetric(float64(p90(ours))/float64(p90(floor)), "p90-ratio")
}

// serverUsec is the time the server at addr has spent executing commands,
// in µs, from INFO commandstats (INFO itself left out).
func serverUsec(b *testing.B, addr string) int64 {
	var total int64
	for cmd, st := range commandStats(b, addr) {
		if cmd != "cmdstat_info" {
			total += st.usec
		}
	}
	return total
}

// reportServerTime reports the server time per op since before
// (serverUsec) as server-us/op: what the store spent on each request,
// which, unlike ns/op, does not include the client or the round trips.
func reportServerTime(b *testing.B, addr string, before int64) {
	b.ReportMetric(float64(serverUsec(b, addr)-before)/float64(b.N), "server-us/op")
}

// holdInFlight starts a first request whose handler blocks until stop is
// called, and returns once the handler is running.
func holdInFlight(b *testing.B, do func(idempotency.Handler) error) (stop func()) {
	running, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- do(func(context.Context, uint64) ([]byte, error) {
			close(running)
			<-release
			return result, nil
		})
	}()
	select {
	case <-running:
	case err := <-done:
		b.Fatalf("first request did not start: %v", err)
	}
	return func() {
		close(release)
		if err := <-done; err != nil {
			b.Error(err)
		}
	}
}

// rawBarrier is the floor: one record per key, "p" while in progress and
// "d"+result once done.
type rawBarrier struct {
	c      *redis.Client
	prefix string
}

const (
	rawLease     = 30 * time.Second
	rawRetention = 24 * time.Hour
)

// do claims key with SET NX GET (one round trip) and, if claimed, runs h
// and stores its result (a second round trip); otherwise it replays the
// stored result or reports ErrInProgress.
func (r rawBarrier) do(ctx context.Context, key string, h idempotency.Handler) ([]byte, bool, error) {
	rec := r.prefix + key
	old, err := r.c.SetArgs(ctx, rec, "p", redis.SetArgs{Mode: "NX", Get: true, TTL: rawLease}).Result()
	switch {
	case errors.Is(err, redis.Nil): // claimed
		res, err := h(ctx, 0)
		if err != nil {
			_ = r.c.Del(context.WithoutCancel(ctx), rec).Err()
			return nil, false, err
		}
		if err := r.c.Set(context.WithoutCancel(ctx), rec, append([]byte{'d'}, res...), rawRetention).Err(); err != nil {
			return nil, false, err
		}
		return res, false, nil
	case err != nil:
		return nil, false, err
	case len(old) > 0 && old[0] == 'd':
		return []byte(old[1:]), true, nil
	default:
		return nil, false, idempotency.ErrInProgress
	}
}
