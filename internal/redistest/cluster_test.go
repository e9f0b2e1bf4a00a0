package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// readOnlyGet reads key on s as a replica serves reads (READONLY on the
// same connection); redis.Nil when s does not have it.
func readOnlyGet(ctx context.Context, t *testing.T, s *Server, key string) (string, error) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	conn := c.Conn()
	defer conn.Close()
	require.NoError(t, conn.ReadOnly(ctx).Err())
	return conn.Get(ctx, key).Result()
}

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
	require.Eventually(t, func() bool { return cl.Lag(m, r) == 0 }, 5*time.Second, 5*time.Millisecond, "the replica catches up while linked")
	v, err := readOnlyGet(ctx, t, r, key)
	require.NoError(t, err)
	require.Equal(t, "before", v)

	cl.StopReplication(m, r)
	require.NoError(t, cc.Set(ctx, key+"2", "after", 0).Err())
	require.Positive(t, cl.Lag(m, r), "a write after StopReplication leaves the replica behind")
	time.Sleep(50 * time.Millisecond) // what a race would need to deliver it anyway
	_, err = readOnlyGet(ctx, t, r, key+"2")
	require.ErrorIs(t, err, redis.Nil, "the replica did not receive the write made after StopReplication")

	cl.ResumeReplication(m, r)
	v, err = readOnlyGet(ctx, t, r, key+"2")
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
