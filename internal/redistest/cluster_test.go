package redistest

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A Cluster with replicas, a replica put behind and promoted: a write the
// master acknowledged before StopReplication is on the promoted replica, a
// write acknowledged after it is not (the order is forced: no write made
// after StopReplication returns can reach the replica), and the Cluster
// client routes the key to the new master when Takeover returns.
func TestClusterReplicaBehindThenTakeover(t *testing.T) {
	ctx := t.Context()
	cl := StartClusterWithReplicas(t, 3, 1)
	require.Len(t, cl.Servers(), 6)
	cc := cl.Client()
	const key = "{k}:x"
	m := cl.MasterOf(ctx, cc, key)
	r := cl.ReplicaOf(m)

	require.NoError(t, cc.Set(ctx, key, "before", 0).Err())
	cl.waitFor(func() bool { return cl.Lag(m, r) == 0 }, "the replica to catch up while linked")
	v, err := r.ReadOnlyGet(ctx, key)
	require.NoError(t, err)
	require.Equal(t, "before", v)

	cl.StopReplication(m, r)
	require.NoError(t, cc.Set(ctx, key+"2", "after", 0).Err())
	require.Positive(t, cl.Lag(m, r), "a write after StopReplication leaves the replica behind")
	// Give a leak time to show: no wait can make the check below fail
	// wrongly, since nothing may arrive at all.
	time.Sleep(50 * time.Millisecond)
	_, err = r.ReadOnlyGet(ctx, key+"2")
	require.ErrorIs(t, err, redis.Nil, "the replica did not receive the write made after StopReplication")

	cl.ResumeReplication(m, r)
	v, err = r.ReadOnlyGet(ctx, key+"2")
	require.NoError(t, err)
	require.Equal(t, "after", v, "ResumeReplication brings the replica up to date")

	cl.StopReplication(m, r)
	require.NoError(t, cc.Set(ctx, key, "lost", 0).Err())
	promoted := cl.Takeover(r, cc, key)
	require.False(t, promoted.IsZero())
	require.Equal(t, r, cl.MasterOf(ctx, cc, key), "the client routes the slot to the promoted replica")
	v, err = cc.Get(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, "before", v, "the new master has the value from before the cut, not the one written after it")
}

// A Cluster wait that runs out fails the test saying what it waited for
// and how long.
func TestClusterWaitSaysWhatItWaitedFor(t *testing.T) {
	rec := &recTB{TB: t}
	cl := &Cluster{tb: rec, wait: 20 * time.Millisecond}
	polls := 0
	cl.waitFor(func() bool { polls++; return false }, "replica %s to link", "127.0.0.1:1")
	require.Equal(t, "redistest: waited 20ms for replica 127.0.0.1:1 to link", rec.fatal)
	require.Greater(t, polls, 1, "it polled until the bound")
}
