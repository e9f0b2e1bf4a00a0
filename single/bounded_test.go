package single_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/contract"
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
// when it is killed, and a failure names the key's master
// (contract.ClusterCallsBounded).
func TestClusterCallsAreBoundedByTheirContext(t *testing.T) {
	contract.ClusterCallsBounded(t, func(c *redis.ClusterClient) (redlease.Strategy, error) { return single.New(c) })
}
