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
	"github.com/redlease/redlease/internal/redistest"
)

// The failover strategy's batch runs WAIT behind the scripts. A key of the
// wrong type is not held; every other key is extended and acknowledged.
// When WAIT falls short (the replica paused), the extended keys become
// undecided and the wrong-type key is still not held.
func TestExtendBatchWrongTypeKeyWithReplica(t *testing.T) {
	ctx := t.Context()
	primary := redistest.Start(t, redistest.Config{})
	replica := redistest.StartReplica(t, primary, redistest.Config{})
	c := primary.Client()
	s, err := failover.New(c, failover.WithWaitTimeout(200*time.Millisecond))
	require.NoError(t, err)

	items := make([]redlease.Extension, 20)
	for i := range items {
		items[i] = redlease.Extension{Key: fmt.Sprintf("fwt:%d", i), Token: fmt.Sprintf("tok-%d", i), TTL: 20 * time.Second}
		require.NoError(t, c.Set(ctx, items[i].Key, items[i].Token, 5*time.Second).Err())
	}
	const bad = 3
	require.NoError(t, c.Del(ctx, items[bad].Key).Err())
	require.NoError(t, c.HSet(ctx, items[bad].Key, "not", "a lock").Err())

	checkBad := func(r redlease.Extended) {
		t.Helper()
		require.ErrorIs(t, r.Err, redlease.ErrNotHeld)
		assert.NotErrorIs(t, r.Err, redlease.ErrUnavailable)
		var ne *redlease.NodeError
		require.ErrorAs(t, r.Err, &ne)
		assert.True(t, redis.HasErrorPrefix(ne.Err, "WRONGTYPE"), "cause: %v", ne.Err)
	}

	out := s.ExtendBatch(ctx, items)
	require.Len(t, out, len(items))
	for i, r := range out {
		if i != bad {
			assert.NoError(t, r.Err, "item %d", i)
		}
	}
	checkBad(out[bad])

	replica.Pause()
	t.Cleanup(replica.Resume)
	out = s.ExtendBatch(ctx, items)
	for i, r := range out {
		if i != bad {
			assert.ErrorIs(t, r.Err, redlease.ErrUnavailable, "item %d: extended, not acknowledged", i)
			assert.ErrorIs(t, r.Err, failover.ErrNotReplicated, "item %d", i)
			assert.NotErrorIs(t, r.Err, redlease.ErrNotHeld, "item %d", i)
		}
	}
	checkBad(out[bad])
}
