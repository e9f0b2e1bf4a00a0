package renew_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/renew"
	"github.com/redlease/redlease/single"
)

// starveRun keeps n locks with a short TTL through one watchdog for hold,
// in a process with GOMAXPROCS=1 whose only P is shared with busy
// goroutines that never block. A lost lock is counted and taken again. It
// returns how many losses there were, and how many renewals ran late
// enough to matter (see the Observer below).
func starveRun(t *testing.T, s redlease.Strategy, n, busy int, ttl, hold time.Duration) (lost int) {
	t.Helper()
	w, err := renew.New()
	require.NoError(t, err)
	defer w.Close()
	locker, err := redlease.New(s, redlease.WithTTL(ttl), redlease.WithRetryDelay(time.Millisecond, 20*time.Millisecond))
	require.NoError(t, err)

	take := func(i int) *redlease.Lock {
		for {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			lk, err := locker.Lock(ctx, fmt.Sprintf("starve:%s:%d", t.Name(), i))
			cancel()
			if err == nil {
				w.Keep(lk)
				return lk
			}
			if t.Context().Err() != nil {
				t.Fatalf("lock %d: %v", i, err)
			}
		}
	}
	locks := make([]*redlease.Lock, n)
	for i := range locks {
		locks[i] = take(i)
	}

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var stop atomic.Bool
	var spin sync.WaitGroup
	var sink atomic.Int64
	for range busy {
		spin.Go(func() {
			x := int64(0)
			for !stop.Load() {
				x++
			}
			sink.Add(x)
		})
	}
	defer func() { stop.Store(true); spin.Wait() }()

	end := time.Now().Add(hold)
	for time.Now().Before(end) {
		time.Sleep(10 * time.Millisecond)
		for i, lk := range locks {
			if !lk.Valid() {
				lost++
				t.Logf("lock %d lost at %v: %v", i, time.Until(end).Round(time.Millisecond), lk.Err())
				locks[i] = take(i)
			}
		}
	}
	for _, lk := range locks {
		_ = lk.Release(context.Background())
	}
	return lost
}

// A process starved of CPU (GOMAXPROCS=1, four goroutines that never
// block, so a goroutine woken by a timer or by a reply waits 15–35 ms for
// the processor, more under -race) keeps twenty healthy locks with a 3 s
// TTL for 8 s, on single and on a quorum whose node timeout (1 s) leaves
// its rounds room for those waits.
//
// This is the bound the package doc states: a renewal costs a few such
// waits, and must fit in (1 − fraction)·TTL less the loss margin, and a
// quorum round within the node timeout. Shorter TTLs are measured, not
// asserted: STARVE_TTL=300ms (and STARVE_NODE_TIMEOUT=100ms) loses dozens
// of locks per 8 s run, before and after the watchdog's rework. A lost
// lock is reported before its Until either way.
func TestStarvedProcessKeepsHealthyLocks(t *testing.T) {
	if testing.Short() {
		t.Skip("8 s per strategy")
	}
	const n, busy, hold = 20, 4, 8 * time.Second
	ttl := starveTTL()
	t.Run("quorum", func(t *testing.T) {
		var clients []redis.UniversalClient
		for _, srv := range redistest.StartN(t, 3, redistest.Config{}) {
			clients = append(clients, srv.Client())
		}
		q, err := quorum.New(clients, quorum.WithNodeTimeout(starveNodeTimeout()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		lost := starveRun(t, q, n, busy, ttl, hold)
		t.Logf("quorum (3 nodes, node timeout %v, TTL %v): %d of %d locks lost in %v", starveNodeTimeout(), ttl, lost, n, hold)
		if lost > 0 {
			t.Errorf("%d healthy locks lost", lost)
		}
	})
	t.Run("single", func(t *testing.T) {
		srv := redistest.Start(t, redistest.Config{})
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = c.Close() })
		strategy, err := single.New(c)
		require.NoError(t, err)
		lost := starveRun(t, strategy, n, busy, ttl, hold)
		t.Logf("single (go-redis defaults, TTL %v): %d of %d locks lost in %v", ttl, lost, n, hold)
		if lost > 0 {
			t.Errorf("%d healthy locks lost", lost)
		}
	})
}

func starveTTL() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("STARVE_TTL")); err == nil {
		return d
	}
	return 3 * time.Second
}

func starveNodeTimeout() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("STARVE_NODE_TIMEOUT")); err == nil {
		return d
	}
	return time.Second
}
