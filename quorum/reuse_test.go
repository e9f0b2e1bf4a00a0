package quorum_test

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
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/quorum"
)

// Rounds are reused once finished. A reply that arrives after its call
// returned must never land in a round that a later call is using: there it
// would count as the later call's vote. Forced order, through a gate in
// front of node 4 that holds the replies of acquire requests:
//
//  1. A takes key a: nodes 0–3 grant, node 4's grant is held; A returns.
//  2. Key b is someone else's on nodes 0, 1 and 4. B asks for it: nodes 2
//     and 3 grant, node 4's refusal is held, so B waits for node 4.
//  3. A's held grant from node 4 is let through: it is A's, not B's.
//  4. B's refusal from node 4 is let through: B must fail, 2 of 5.
//
// Had A's round been handed to B while A's request to node 4 was still in
// flight, step 3 would have given B its third vote: a grant of b while its
// owner holds it on three nodes.
func TestLateReplyNeverReachesALaterCall(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	servers := redistest.StartN(t, 5, redistest.Config{})
	gate := redistest.NewGate(t, servers[4].Addr)
	node4 := redis.NewClient(&redis.Options{Addr: gate.Addr, ReadTimeout: 30 * time.Second})
	t.Cleanup(func() { _ = node4.Close() })
	clients := make([]redis.UniversalClient, 0, 5)
	for _, srv := range servers[:4] {
		clients = append(clients, srv.Client())
	}
	clients = append(clients, node4)
	for _, srv := range servers { // scripts cached, so that every acquire is one EVALSHA
		require.NoError(t, script.Acquire.Load(t.Context(), srv.Client()))
		require.NoError(t, script.Release.Load(t.Context(), srv.Client()))
	}
	q, err := quorum.New(clients, quorum.WithNodeTimeout(10*time.Second), quorum.WithoutFencing())
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	ctx := t.Context()
	warm := contract.Key(t) + ":warm"
	_, err = q.Acquire(ctx, warm, "warm", time.Minute) // first contact: run_ids asked
	require.NoError(t, err)
	// The warm-up returned at a majority: its request to node 4 may not
	// have reached the gate yet. Sent after HoldReplies, its reply would be
	// held too, and be the oldest that step 3 lets through, not A's.
	probe.WaitFor(t, 5*time.Second, 3, time.Millisecond, func() bool {
		return servers[4].Client().Exists(ctx, warm).Val() == 1
	}, "the warm-up never reached node 4")

	keyA, keyB := contract.Key(t)+":a", contract.Key(t)+":b"
	gate.HoldReplies(script.Acquire.Hash())
	_, err = q.Acquire(ctx, keyA, "tok-a", 30*time.Second)
	require.NoError(t, err, "nodes 0-3 grant A")
	require.NoError(t, gate.WaitHeld(1, "", 5*time.Second), "node 4's reply to A is held")

	for _, i := range []int{0, 1, 4} {
		require.NoError(t, servers[i].Client().Set(ctx, keyB, "owner", 30*time.Second).Err())
	}
	type result struct {
		g   redlease.Grant
		err error
	}
	done := make(chan result, 1)
	go func() {
		g, err := q.Acquire(context.Background(), keyB, "tok-b", 30*time.Second)
		done <- result{g, err}
	}()
	require.NoError(t, gate.WaitHeld(2, "", 5*time.Second), "node 4's reply to B is held too")
	require.NoError(t, gate.Step("", 5*time.Second), "A's late grant from node 4 (the oldest held) goes through")
	require.NoError(t, gate.Step("", 5*time.Second), "B's refusal from node 4 goes through")
	gate.Open()

	r := redistest.Await(t, probe, done, 15*time.Second, 3, "B never returned")
	require.Error(t, r.err, "B was granted b, which its owner holds on nodes 0, 1 and 4: a late reply to A counted for B")
	assert.ErrorIs(t, r.err, redlease.ErrNotObtained)
	v, err := servers[4].Client().Get(ctx, keyB).Result()
	require.NoError(t, err)
	assert.Equal(t, "owner", v)
}
