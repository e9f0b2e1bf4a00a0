package single_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/single"
)

// With go-redis's default options (no ContextTimeoutEnabled: a read waits
// for the 3 s ReadTimeout, then retries), a paused node must not hold a
// call past its ctx: TryLock, Extend and Release with a 300 ms ctx return
// within it (plus scheduling), the TryLock as not obtained and
// unavailable. An acquisition that was abandoned but applied once the node
// resumed is undone by its own token, so the key frees up.
func TestCallsAreBoundedByTheirContextWithDefaultClientOptions(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = c.Close() })
	t.Cleanup(srv.Resume)
	strategy, err := single.New(c)
	require.NoError(t, err)
	l, err := redlease.New(strategy, redlease.WithTTL(10*time.Second))
	require.NoError(t, err)
	ctx := t.Context()
	held, err := l.TryLock(ctx, "bounded:held") // scripts loaded, a connection open
	require.NoError(t, err)

	srv.Pause()
	timed := redistest.BoundedCalls(ctx, t, probe)
	err = timed("TryLock", func(c context.Context) error { _, err := l.TryLock(c, "bounded:new"); return err })
	require.NotErrorIs(t, err, redlease.ErrNotObtained)
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	err = timed("Extend", func(c context.Context) error { return held.Extend(c, 10*time.Second) })
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	// The watchdog's path: a batch renewal (found by the simulator, watchdog-
	// mixed seed 511: one lost message held a renewal slot for 3 s and more).
	err = timed("ExtendAll", func(c context.Context) error { return redlease.ExtendAll(c, []*redlease.Lock{held})[0] })
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	err = timed("Release", func(c context.Context) error { return held.Release(c) })
	require.Error(t, err)
	srv.Resume()

	// The abandoned acquisition reached the node when it resumed; its undo
	// removes it, so the key can be taken.
	var lk *redlease.Lock
	for range 100 {
		if lk, err = l.TryLock(ctx, "bounded:new"); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, err, "the abandoned acquisition's key was never undone")
	require.NoError(t, lk.Release(ctx))
}

// A Cluster user's go-redis ClusterClient (routing policies on, as by
// default) fetches COMMAND at its first routed command, and with
// ContextTimeoutEnabled it does so on a ctx of its own (5 s), not the
// caller's. Forced order: the client knows the topology and has a
// connection to every master (ForEachMaster), has not fetched COMMAND
// yet, and every master is paused. TryLock and Do with a 300 ms ctx
// return near it, unavailable, with ContextTimeoutEnabled on and off
// (found by the simulator: watchdog-mixed seed 2, the fresh-client
// construction; before the fix, 5.05 s).
func TestFreshClusterClientKeepsTheDeadlineWithPausedMasters(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	servers := redistest.StartCluster(t, 3)
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr
		t.Cleanup(s.Resume)
	}
	for _, cte := range []bool{true, false} {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: cte})
		t.Cleanup(func() { _ = c.Close() })
		require.NoError(t, c.ForEachMaster(t.Context(), func(ctx context.Context, m *redis.Client) error {
			return m.Ping(ctx).Err()
		}))
		strategy, err := single.New(c)
		require.NoError(t, err)
		l, err := redlease.New(strategy, redlease.WithPolling())
		require.NoError(t, err)
		for _, s := range servers {
			s.Pause()
		}
		const bound, slack = 300 * time.Millisecond, 400 * time.Millisecond
		for _, op := range []string{"TryLock", "Do"} {
			ctx, cancel := context.WithTimeout(t.Context(), bound)
			start := time.Now()
			if op == "TryLock" {
				_, err = l.TryLock(ctx, "fresh:cluster")
			} else {
				err = l.Do(ctx, "fresh:cluster", func(context.Context, *redlease.Lock) error { return nil })
			}
			took := time.Since(start)
			cancel()
			t.Logf("ContextTimeoutEnabled=%v %s with every master paused: %v after %v", cte, op, err, took.Round(time.Millisecond))
			assert.ErrorIs(t, err, redlease.ErrUnavailable, "%s (ContextTimeoutEnabled %v)", op, cte)
			if ok, why := probe.Within(took, bound+slack, 3, start); !ok {
				assert.Failf(t, "outside the window derived from this run", "%s (ContextTimeoutEnabled %v) must return near its ctx's deadline: %s", op, cte, why)
			}
		}
		for _, s := range servers {
			s.Resume()
		}
	}
}

// Every call on a Cluster client returns by its ctx deadline, with
// ContextTimeoutEnabled on and off, when the key's master is paused and
// when it is killed: TryLock, Lock and Do on a new key of that master, and
// Extend, ExtendAll and Release of a lock held there, each with a 300 ms
// ctx, on a client that has been in use (topology and COMMAND known). A
// new Cluster per case.
func TestClusterCallsAreBoundedByTheirContext(t *testing.T) {
	for _, fault := range []string{"paused", "killed"} {
		for _, cte := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s master, ContextTimeoutEnabled %v", fault, cte), func(t *testing.T) {
				probe := redistest.StartStallProbe(t)
				servers := redistest.StartCluster(t, 3)
				addrs := make([]string, len(servers))
				for i, s := range servers {
					addrs[i] = s.Addr
					t.Cleanup(s.Resume)
				}
				c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: cte})
				t.Cleanup(func() { _ = c.Close() })
				strategy, err := single.New(c)
				require.NoError(t, err)
				l, err := redlease.New(strategy, redlease.WithPolling(), redlease.WithTTL(10*time.Second))
				require.NoError(t, err)
				ctx := t.Context()
				held, err := l.TryLock(ctx, "{bounded}:held")
				require.NoError(t, err)
				m, err := c.MasterForKey(ctx, "{bounded}:held")
				require.NoError(t, err)
				var victim *redistest.Server
				for _, s := range servers {
					if s.Addr == m.Options().Addr {
						victim = s
					}
				}
				require.NotNil(t, victim, "the key's master %s", m.Options().Addr)
				if fault == "paused" {
					victim.Pause()
				} else {
					victim.Kill()
					// go-redis redials a dead address from a goroutine of
					// its own (pool.tryDial), which sleeps 1 s between
					// dials and ends at the first one after its client
					// closed: close it, then wait, bounded.
					t.Cleanup(func() {
						_ = c.Close()
						waitRedialsEnd(t, 3*time.Second)
					})
				}
				timed := redistest.BoundedCalls(ctx, t, probe)
				err = timed("TryLock", func(c context.Context) error { _, err := l.TryLock(c, "{bounded}:new"); return err })
				assert.ErrorIs(t, err, redlease.ErrUnavailable)
				var ne *redlease.NodeError
				if assert.ErrorAs(t, err, &ne) {
					assert.Equal(t, victim.Addr, ne.Addr, "the failure names the key's master, not the client's first address")
				}
				err = timed("Lock", func(c context.Context) error { _, err := l.Lock(c, "{bounded}:new"); return err })
				assert.ErrorIs(t, err, redlease.ErrUnavailable)
				err = timed("Do", func(c context.Context) error {
					return l.Do(c, "{bounded}:new", func(context.Context, *redlease.Lock) error { return nil })
				})
				assert.ErrorIs(t, err, redlease.ErrUnavailable)
				err = timed("Extend", func(c context.Context) error { return held.Extend(c, 10*time.Second) })
				assert.ErrorIs(t, err, redlease.ErrUnavailable)
				err = timed("ExtendAll", func(c context.Context) error { return redlease.ExtendAll(c, []*redlease.Lock{held})[0] })
				assert.ErrorIs(t, err, redlease.ErrUnavailable)
				err = timed("Release", func(c context.Context) error { return held.Release(c) })
				assert.Error(t, err)
			})
		}
	}
}

// waitRedialsEnd waits at most limit for every goroutine of go-redis's
// redial probe (pool.(*ConnPool).tryDial) to end, and fails tb if one is
// left: a closed client's probe ends at its next wake, a second at most.
func waitRedialsEnd(tb testing.TB, limit time.Duration) {
	tb.Helper()
	buf := make([]byte, 1<<20)
	for end := time.Now().Add(limit); ; {
		n := runtime.Stack(buf, true)
		if !strings.Contains(string(buf[:n]), "(*ConnPool).tryDial") {
			return
		}
		if time.Now().After(end) {
			tb.Errorf("a go-redis redial probe still runs %v after its client closed", limit)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
