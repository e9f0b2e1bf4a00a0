package quorum_test

import (
	"errors"
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

// A node's trouble with one key is that key's business on that node only:
// its answers for every other key still count. Five nodes, one of them
// down; key 7 is a hash on node 0, key 8 a hash on node 1, so each still
// has three nodes that hold it, and key 9 is a hash on three nodes, so a
// quorum can no longer hold it.
func TestExtendBatchCountsEachKeyOnEachNode(t *testing.T) {
	ctx := t.Context()
	servers := redistest.StartN(t, 5, redistest.Config{})
	clients := make([]redis.UniversalClient, len(servers))
	for i, srv := range servers {
		clients[i] = srv.Client()
	}
	s, err := quorum.New(clients, quorum.WithNodeTimeout(2*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })

	items := make([]redlease.Extension, 50)
	for i := range items {
		items[i] = redlease.Extension{Key: fmt.Sprintf("pernode:%d", i), Token: fmt.Sprintf("tok-%d", i), TTL: 20 * time.Second}
		for _, c := range clients { // on every node, so each count below is known
			require.NoError(t, c.Set(ctx, items[i].Key, items[i].Token, 5*time.Second).Err())
		}
	}
	hash := func(node, item int) {
		require.NoError(t, clients[node].Del(ctx, items[item].Key).Err())
		require.NoError(t, clients[node].HSet(ctx, items[item].Key, "not", "a lock").Err())
	}
	hash(0, 7)
	hash(1, 8)
	hash(0, 9)
	hash(1, 9)
	hash(3, 9)
	servers[2].Kill()

	start := time.Now()
	out := s.ExtendBatch(ctx, items)
	require.Len(t, out, len(items))
	for i, r := range out {
		if i == 9 {
			continue
		}
		if assert.NoError(t, r.Err, "item %d: three nodes still hold it", i) {
			// Until is the call's start plus 20 s less the drift allowance.
			assert.True(t, r.Grant.Until.After(start.Add(10*time.Second)), "item %d: Until %v after the call's start", i, r.Grant.Until.Sub(start))
		}
	}
	for _, node := range []int{3, 4} {
		// Set with 5 s before start: extended, the key outlives item 7's Until.
		at, ok, err := redistest.Expiry(ctx, clients[node], items[7].Key)
		require.NoError(t, err)
		require.True(t, ok, "node %d: item 7 has a TTL", node)
		assert.False(t, at.Add(redistest.Precision).Before(out[7].Grant.Until), "node %d extended item 7: its key outlives the Until (by %v)", node, at.Sub(out[7].Grant.Until))
	}

	err = out[9].Err
	require.ErrorIs(t, err, redlease.ErrNotHeld, "three nodes hold something else: no quorum can hold our token")
	var qe *redlease.QuorumError
	require.ErrorAs(t, err, &qe)
	assert.Equal(t, 1, qe.Votes, "node 4 extended it")
	wrongType := map[int]bool{}
	for _, cause := range qe.Unwrap()[1:] {
		var ne *redlease.NodeError
		require.True(t, errors.As(cause, &ne), "cause %v", cause)
		switch {
		case redis.HasErrorPrefix(ne.Err, "WRONGTYPE"):
			wrongType[ne.Node] = true
			assert.Equal(t, servers[ne.Node].Addr, ne.Addr)
		case ne.Node == 2: // down; its refused dial may come after the decision
		default:
			t.Errorf("unexpected cause: %v", ne)
		}
	}
	assert.Equal(t, map[int]bool{0: true, 1: true, 3: true}, wrongType, "one WRONGTYPE cause per node that has a hash there")

	// Two more hashes leave item 8 one holder: it alone is not held, and
	// item 7 beside it is still extended.
	hash(3, 8)
	hash(4, 8)
	out = s.ExtendBatch(ctx, items[7:9])
	require.NoError(t, out[0].Err, "item 7")
	require.ErrorIs(t, out[1].Err, redlease.ErrNotHeld, "item 8")
}
