package failover_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/contract"
)

// A set taken in one step while the replica does not answer (paused) is
// refused as an outage (ErrUnavailable and ErrNotReplicated, not
// ErrNotObtained), as one key's grant is, and none of its keys is left
// on the primary when AcquireSet returns; once the replica answers, the
// same set is granted, each key fenced.
func TestUnacknowledgedSetIsRefused(t *testing.T) {
	g := startGroup(t)
	s, err := failover.New(g.client, failover.WithWaitTimeout(100*time.Millisecond))
	require.NoError(t, err)
	ctx, key := t.Context(), contract.Key(t)
	keys := []string{key + ":a", key + ":b"}

	g.replica.Pause()
	t.Cleanup(g.replica.Resume)
	_, at, err := s.AcquireSet(ctx, keys, "tok_S.1", 5*time.Second)
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	assert.NotErrorIs(t, err, redlease.ErrNotObtained)
	assert.ErrorIs(t, err, failover.ErrNotReplicated)
	assert.Equal(t, -1, at, "no key refused it")
	n, err := g.client.Exists(ctx, keys...).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the unacknowledged set must be undone")

	g.replica.Resume()
	grants, _, err := s.AcquireSet(ctx, keys, "tok_S.2", 5*time.Second)
	require.NoError(t, err, "granted once the replica answers (taking over attempt 1's keys, were any left)")
	require.Len(t, grants, 2)
	for i, gr := range grants {
		assert.NotZero(t, gr.Fence, "key %d fenced", i)
	}
}
