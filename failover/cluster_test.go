package failover_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/contract"
	"github.com/redlease/redlease/internal/redistest"
)

// The failover strategy on a real Redis Cluster of three masters with a
// replica each: the contract, and every grant on the replica of its key's
// master by the time it is returned (WAIT ran in the grant's pipeline on
// the master's connection; reading the replica at once is exact).
func TestOnClusterWithReplicas(t *testing.T) {
	cl := redistest.StartClusterWithReplicas(t, 3, 1)
	c := cl.Client()
	contract.Run(t, func(t *testing.T) contract.Setup {
		s, err := failover.New(c)
		require.NoError(t, err)
		return contract.Setup{Strategy: s, Nodes: []redis.UniversalClient{c}, Quorum: 1, Fencing: true}
	})

	t.Run("every grant is on the replica when returned", func(t *testing.T) {
		ctx := t.Context()
		s, err := failover.New(c)
		require.NoError(t, err)
		masters := map[string]bool{}
		for i := range 30 {
			key := fmt.Sprintf("acked:%d", i)
			tok := fmt.Sprintf("tok%d", i)
			_, err := s.Acquire(ctx, key, tok, 10*time.Second)
			require.NoError(t, err)
			m := cl.MasterOf(ctx, c, key)
			masters[m.Addr] = true
			got, err := cl.ReplicaOf(m).ReadOnlyGet(ctx, key)
			require.NoError(t, err, key)
			assert.Equal(t, tok, got, key)
		}
		assert.Len(t, masters, 3, "locks live on every master")
	})

	t.Run("renewals of keys on every master", func(t *testing.T) {
		ctx := t.Context()
		s, err := failover.New(c)
		require.NoError(t, err)
		var items []redlease.Extension
		for i := range 200 {
			key := fmt.Sprintf("batch:%d", i)
			_, err := s.Acquire(ctx, key, "tok", 5*time.Second)
			require.NoError(t, err)
			items = append(items, redlease.Extension{Key: key, Token: "tok", TTL: 20 * time.Second})
		}
		items = append(items, redlease.Extension{Key: "batch:not-held", Token: "tok", TTL: 20 * time.Second})
		before := time.Now()
		out := s.ExtendBatch(ctx, items)
		for i, o := range out[:200] {
			require.NoError(t, o.Err, items[i].Key)
			assert.True(t, o.Grant.Until.After(before.Add(15*time.Second)), items[i].Key)
		}
		assert.ErrorIs(t, out[200].Err, redlease.ErrNotHeld)
		// Each key outlives the Until its renewal gave, by its master's
		// clock (not "PTTL > 15 s": beside yes > /dev/null x2 and another
		// make test, these 200 reads one after the other took more than 5 s).
		for i, it := range items[:200:200] {
			m := cl.MasterOf(ctx, c, it.Key)
			at, ok, err := redistest.Expiry(ctx, m.Client(), it.Key)
			require.NoError(t, err)
			require.True(t, ok, "%s has a TTL", it.Key)
			assert.False(t, at.Add(redistest.Precision).Before(out[i].Grant.Until), "%s: the key expires %v after the renewal's start, its Until is %v after it",
				it.Key, at.Sub(before), out[i].Grant.Until.Sub(before))
		}
	})
}

// A grant whose shard's replica is behind is refused as an outage, not
// granted: the replica could be promoted without it. Forced order: the
// replica's link is cut first (redistest.StopReplication), then the
// acquisition. The key is not left on the master, and once the link is
// back the same key is granted.
func TestOnClusterAGrantTheReplicaMissedIsRefused(t *testing.T) {
	cl := redistest.StartClusterWithReplicas(t, 3, 1)
	c := cl.Client()
	ctx := t.Context()
	s, err := failover.New(c, failover.WithWaitTimeout(50*time.Millisecond))
	require.NoError(t, err)
	const key = "behind"
	m := cl.MasterOf(ctx, c, key)
	r := cl.ReplicaOf(m)
	cl.StopReplication(m, r)

	_, err = s.Acquire(ctx, key, "tok", 10*time.Second)
	require.Error(t, err)
	assert.ErrorIs(t, err, failover.ErrNotReplicated)
	assert.ErrorIs(t, err, redlease.ErrUnavailable)
	assert.NotErrorIs(t, err, redlease.ErrNotObtained)
	n, err := m.Client().Exists(ctx, key).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the refused grant's key is undone on the master before Acquire returns")

	cl.ResumeReplication(m, r)
	_, err = s.Acquire(ctx, key, "tok2", 10*time.Second)
	require.NoError(t, err)
}

// A shard without a replica cannot fail over: its grants wait for none.
func TestOnClusterWithoutReplicas(t *testing.T) {
	servers := redistest.StartCluster(t, 3)
	c := redistest.ClusterClient(t, servers)
	s, err := failover.New(c)
	require.NoError(t, err)
	ctx := t.Context()
	for i := range 10 {
		_, err := s.Acquire(ctx, fmt.Sprintf("lone:%d", i), "tok", 5*time.Second)
		require.NoError(t, err)
	}
	// A minimum the shards cannot meet is refused as not replicated.
	strict, err := failover.New(c, failover.WithReplicas(1), failover.WithWaitTimeout(20*time.Millisecond))
	require.NoError(t, err)
	_, err = strict.Acquire(ctx, "lone:strict", "tok", 5*time.Second)
	assert.ErrorIs(t, err, failover.ErrNotReplicated)
}

// A Cluster master killed once its replica acknowledged the lock, and the
// replica promoted: the holder keeps the lock, renewed on the new master
// (contract.ClusterFailoverKeeps). The new master lists no replica while
// the old one is dead, so its renewals wait for none.
func TestOnClusterAFailoverKeepsAnAcknowledgedLock(t *testing.T) {
	contract.ClusterFailoverKeeps(t, func(c *redis.ClusterClient) (redlease.Strategy, error) { return failover.New(c) })
}

// A slot left half migrated, on the failover strategy: the key still on
// the migrating master is renewed there and acknowledged by its replica;
// the moved key fails there alone and is renewed on the importing master
// (ASKING), acknowledged by that master's replica.
func TestOnClusterAHalfMigratedSlotKeepsBothLocks(t *testing.T) {
	contract.ClusterHalfMigratedKeeps(t, 1, func(c *redis.ClusterClient) (redlease.Strategy, error) { return failover.New(c) })
}

// Every call of the failover strategy on a Cluster client returns by its
// ctx deadline, with ContextTimeoutEnabled on and off, when the key's
// master is paused and when it is killed, and a failure names the key's
// master (contract.ClusterCallsBounded; three masters without replicas:
// WAIT for none).
func TestOnClusterCallsAreBoundedByTheirContext(t *testing.T) {
	contract.ClusterCallsBounded(t, func(c *redis.ClusterClient) (redlease.Strategy, error) { return failover.New(c) })
}
