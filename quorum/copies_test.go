package quorum_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/quorum"
)

// A grant decided by four of five nodes still writes its key on the fifth
// when that node's request was only waiting in the queue: a lock left on a
// bare majority would survive no node failure for its whole life, although
// four nodes answer (found by renew's mixed-strategy test: a quorum lock on
// nodes {0,1,4} was lost when node 0 was black-holed). Forced order: node
// 0 has one worker, busy with A's acquisition held in a gate; B's
// acquisition is granted by nodes 1–4 while its request to node 0 waits in
// the queue; then the gate opens.
func TestGrantStillWritesQueuedCopies(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	servers := redistest.StartN(t, 5, redistest.Config{})
	gate := redistest.NewGate(t, servers[0].Addr)
	node0 := redis.NewClient(&redis.Options{Addr: gate.Addr, ReadTimeout: 30 * time.Second})
	t.Cleanup(func() { _ = node0.Close() })
	clients := []redis.UniversalClient{node0}
	for _, srv := range servers[1:] {
		clients = append(clients, srv.Client())
	}
	for _, srv := range servers { // scripts cached, so that the held chunk is the EVALSHA
		require.NoError(t, script.Acquire.Load(t.Context(), srv.Client()))
		require.NoError(t, script.Release.Load(t.Context(), srv.Client()))
	}
	q, err := quorum.New(clients, quorum.WithWorkersPerNode(1), quorum.WithNodeTimeout(5*time.Second), quorum.WithoutFencing())
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	l, err := redlease.New(q, redlease.WithTTL(30*time.Second))
	require.NoError(t, err)
	ctx := t.Context()

	gate.HoldRequests(script.Acquire.Hash())
	a, err := l.TryLock(ctx, "copies:a")
	require.NoError(t, err)
	require.NoError(t, gate.WaitHeld(1, "", 5*time.Second), "A's request to node 0 is held: its worker is busy")
	b, err := l.TryLock(ctx, "copies:b") // its request to node 0 waits in the queue
	require.NoError(t, err)
	gate.Open()

	// B's key reaches node 0 within 5 s, widened by 3 × the stall this
	// run measured meanwhile (probe.WaitFor).
	direct := servers[0].Client()
	probe.WaitFor(t, 5*time.Second, 3, 20*time.Millisecond, func() bool {
		n, err := direct.Exists(context.Background(), "copies:b").Result()
		require.NoError(t, err)
		return n == 1
	}, "B's key never reached node 0: the grant left it on four of five nodes, and its queued request was dropped")
	require.NoError(t, a.Release(ctx))
	require.NoError(t, b.Release(ctx))
}
