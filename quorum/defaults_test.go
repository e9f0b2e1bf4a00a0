package quorum_test

import (
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
)

// The strategy for money hands out fences without being asked, and they
// rise from holder to holder; WithoutFencing turns them off.
func TestFencesAreOnByDefault(t *testing.T) {
	var clients []redis.UniversalClient
	for _, srv := range redistest.StartN(t, 3, redistest.Config{}) {
		clients = append(clients, srv.Client())
	}
	q, err := quorum.New(clients)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	l, err := redlease.New(q)
	require.NoError(t, err)
	ctx := t.Context()
	var last uint64
	for i := range 3 {
		lk, err := l.TryLock(ctx, "defaults:fence")
		require.NoError(t, err)
		assert.Greater(t, lk.Fence(), last, "grant %d", i)
		last = lk.Fence()
		require.NoError(t, lk.Release(ctx))
	}

	off, err := quorum.New(clients, quorum.WithoutFencing())
	require.NoError(t, err)
	t.Cleanup(func() { _ = off.Close() })
	locker, err := redlease.New(off)
	require.NoError(t, err)
	lk, err := locker.TryLock(ctx, "defaults:nofence")
	require.NoError(t, err)
	assert.Zero(t, lk.Fence(), "WithoutFencing")
	require.NoError(t, lk.Release(ctx))
}

// One server named twice would vote twice: refused at construction, for the
// same client and for two clients of the same address.
func TestDuplicateNodesAreRefused(t *testing.T) {
	a := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6390"})
	b := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6391"})
	a2 := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6390"})
	t.Cleanup(func() { _ = a.Close(); _ = b.Close(); _ = a2.Close() })

	_, err := quorum.New([]redis.UniversalClient{a, a, a})
	require.ErrorIs(t, err, redlease.ErrInvalid)
	assert.Contains(t, err.Error(), "nodes 0 and 1 are the same server")

	_, err = quorum.New([]redis.UniversalClient{a, b, a2})
	require.ErrorIs(t, err, redlease.ErrInvalid)
	assert.Contains(t, err.Error(), "nodes 0 and 2 are the same server (127.0.0.1:6390)")

	q, err := quorum.New([]redis.UniversalClient{a, b})
	require.NoError(t, err)
	require.NoError(t, q.Close())
}

// Down is not held: an acquisition that dead nodes decided matches
// ErrUnavailable and not ErrNotObtained, one refused because the lock is
// held matches ErrNotObtained only; both messages are one line, with one
// "redlease:" prefix.
func TestDownIsNotHeld(t *testing.T) {
	servers, clients := nodes(t, 3)
	q := strategy(t, clients)
	l, err := redlease.New(q)
	require.NoError(t, err)
	ctx := t.Context()

	held, err := l.TryLock(ctx, "defaults:held")
	require.NoError(t, err)
	_, err = l.TryLock(ctx, "defaults:held")
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.NotErrorIs(t, err, redlease.ErrUnavailable, "refused by every node: held, not down")
	require.NoError(t, held.Release(ctx))

	servers[1].Kill()
	servers[2].Kill()
	_, err = l.TryLock(ctx, "defaults:down")
	require.NotErrorIs(t, err, redlease.ErrNotObtained, "down is not held")
	require.ErrorIs(t, err, redlease.ErrUnavailable, "two of three nodes down")
	var ne *redlease.NodeError
	require.ErrorAs(t, err, &ne)
	assert.NotContains(t, err.Error(), "\n", "one line")
	assert.Equal(t, 1, strings.Count(err.Error(), "redlease:"), "one prefix: %s", err)
	t.Log(err)
}

// Close is bounded even when a node is hung and the clients have go-redis's
// default options (a worker's call then waits for the 3 s read timeout and
// retries, whatever its context says).
func TestCloseIsBoundedWithAHungNode(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	servers := redistest.StartN(t, 3, redistest.Config{})
	var clients []redis.UniversalClient
	for _, srv := range servers {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr})
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	t.Cleanup(servers[0].Resume)
	q, err := quorum.New(clients)
	require.NoError(t, err)
	l, err := redlease.New(q)
	require.NoError(t, err)
	lk, err := l.TryLock(t.Context(), "defaults:close")
	require.NoError(t, err)
	servers[0].Pause()
	// Node 0's worker now waits on the paused node. (The outcome depends on
	// whether the grant's third write had landed: not the point here.)
	_ = lk.Release(t.Context())
	// Close waits for the live nodes' workers to finish their current
	// request: how long nodes 1 and 2 take to answer is measured through
	// their own clients while it runs.
	live := redistest.StartNodeProbe(t, clients[1], clients[2])
	start := time.Now()
	require.NoError(t, q.Close())
	took := time.Since(start)
	t.Logf("Close with a hung node took %v", took.Round(time.Millisecond))
	// The window: Close's documented bound, two node timeouts, plus 3 ×
	// (what this process was measured stalled meanwhile + the worst round
	// trip a PING to a live node took meanwhile). go-redis's read timeout
	// (3 s), which Close must not wait for, is far outside it on a quiet
	// machine.
	if ok, why := live.Within(probe, took, 2*quorum.DefaultNodeTimeout, 3, start); !ok {
		assert.Failf(t, "outside the window derived from this run", "Close must return within two node timeouts, not wait for go-redis's read timeout: %s", why)
	}
	live.Stop()
}

// Two addresses of one server (here a forwarder in front of node 0) pass
// quorum.New, which can only compare addresses; at first contact their
// run_id gives them away, and that server's vote counts once. With the
// real second server down, the "majority" would be one server twice: it
// is refused, and the error says why.
func TestOneServerUnderTwoAddressesVotesOnce(t *testing.T) {
	servers := redistest.StartN(t, 2, redistest.Config{})
	gate := redistest.NewGate(t, servers[0].Addr) // forwards everything
	clients := []redis.UniversalClient{servers[0].Client(), servers[1].Client()}
	alias := redis.NewClient(&redis.Options{Addr: gate.Addr})
	t.Cleanup(func() { _ = alias.Close() })
	clients = append(clients, alias)
	// The run_id round waits a quarter of the node timeout: 250 ms here,
	// so that a loaded machine's slow answer still identifies the alias
	// before the first grant (with the 100 ms default it waits 25 ms, and
	// an alias that answers later counts as its own server until the next
	// round 30 s on — a documented limit).
	q, err := quorum.New(clients, quorum.WithNodeTimeout(time.Second))
	require.NoError(t, err, "different addresses")
	t.Cleanup(func() { _ = q.Close() })
	l, err := redlease.New(q)
	require.NoError(t, err)
	ctx := t.Context()

	lk, err := l.TryLock(ctx, "defaults:alias")
	require.NoError(t, err, "nodes 0 and 1 agree: a majority of two real servers")
	require.NoError(t, lk.Release(ctx))

	servers[1].Kill()
	_, err = l.TryLock(ctx, "defaults:alias2")
	require.ErrorIs(t, err, redlease.ErrUnavailable, "node 0 twice is not a majority")
	assert.Contains(t, err.Error(), "the same server as node 0")
	t.Log(err)
}
