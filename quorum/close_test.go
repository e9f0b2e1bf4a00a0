package quorum_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
)

// closeMargin is what a Close may take beyond its documented bound: the
// scheduling of a few goroutines on a loaded machine. The bound it guards
// against is the 2 s that Close waited for release-notice hubs held by a
// paused node.
const closeMargin = 500 * time.Millisecond

// Close returns within two node timeouts while waiters are subscribed and
// every node is paused, one of them since before the waiters came: the
// release-notice hub of that node is then inside go-redis's dial, whose
// handshake waits for a reply the paused node never sends while it holds
// the lock that closing the subscription needs. The order is forced: the
// test waits until the paused node's accept queue holds the hub's
// connection. With and without ContextTimeoutEnabled (the dial runs under
// the hub's own context, so the option does not bound it).
func TestCloseIsBoundedWithWaitersOnPausedNodes(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	for _, cte := range []bool{true, false} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", cte), func(t *testing.T) {
			servers := redistest.StartN(t, 3, redistest.Config{})
			clients := make([]redis.UniversalClient, len(servers))
			for i, srv := range servers {
				c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: cte})
				t.Cleanup(func() { _ = c.Close() })
				clients[i] = c
			}
			q, err := quorum.New(clients)
			require.NoError(t, err)
			key := "close:paused"

			servers[0].Pause()
			t.Cleanup(servers[0].Resume)
			_, stop, err := q.Watch(t.Context(), key, "")
			require.NoError(t, err)
			defer stop(false)
			// Listen registers only where enough nodes confirmed the
			// subscription: nodes 1 and 2 did.
			_, stopListen, ok := q.Listen(t.Context(), key, "")
			require.True(t, ok, "nodes 1 and 2 never confirmed the subscription")
			defer stopListen(false)
			var queued int
			var qerr error
			probe.WaitFor(t, 10*time.Second, 3, 5*time.Millisecond, func() bool {
				queued, qerr = servers[0].Unaccepted()
				return qerr != nil || queued > 0
			}, "no connection to the paused node 0")
			require.NoError(t, qerr)
			for _, srv := range servers[1:] {
				srv.Pause()
				t.Cleanup(srv.Resume)
			}

			start := time.Now()
			require.NoError(t, q.Close())
			took := time.Since(start)
			bound := 2 * quorum.DefaultNodeTimeout
			t.Logf("Close took %v (bound %v; %d connection(s) waiting on paused node 0)", took.Round(time.Millisecond), bound, queued)
			if ok, why := probe.Within(took, bound+closeMargin, 3, start); !ok {
				assert.Failf(t, "outside the window derived from this run", "Close waited past two node timeouts (%v) for a hub held by a paused node: %s", bound, why)
			}
		})
	}
}

// Lock on a strategy already closed ends at once with ErrInvalid: no node
// can be reached, and that is no outage to wait out. Before, every attempt
// failed with ErrUnavailable ("fanout closed") and Lock retried them until
// its outage limit or its ctx (the simulator's ops seed 3166 spun there on
// virtual time). The ctx's deadline is only a guard: the assertion is that
// it did not end the call.
func TestLockAfterCloseIsRefusedAtOnce(t *testing.T) {
	_, clients := nodes(t, 3)
	q, err := quorum.New(clients)
	require.NoError(t, err)
	require.NoError(t, q.Close())
	l, err := redlease.New(q, redlease.WithOutageLimit(time.Hour))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = l.Lock(ctx, "closed")
	require.ErrorIs(t, err, redlease.ErrInvalid)
	assert.NotErrorIs(t, err, redlease.ErrUnavailable)
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "Lock retried until its ctx ended")
}
