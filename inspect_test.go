package redlease_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
)

// An outage is never "held": with the nodes down, Inspect says
// ErrUnavailable (not a verdict), with every node's cause; with one of
// three down, the other two decide.
func TestInspectOutage(t *testing.T) {
	t.Parallel()
	servers := redistest.StartN(t, 3, redistest.Config{})
	cs := directClients(t, servers)
	l := newLocker(t, quorumOver(t, cs))
	ctx := t.Context()
	lk, err := l.TryLock(ctx, "outage")
	require.NoError(t, err)

	servers[2].Kill()
	in, err := l.Inspect(ctx, "outage")
	require.NoError(t, err)
	assert.Equal(t, redlease.KeyHeld, in.State)
	assert.Equal(t, lk.Token(), in.Token)
	assert.Error(t, in.Nodes[2].Err)

	servers[1].Kill()
	in, err = l.Inspect(ctx, "outage")
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	assert.NotErrorIs(t, err, redlease.ErrNotHeld)
	var qe *redlease.QuorumError
	require.ErrorAs(t, err, &qe)
	assert.Equal(t, 1, qe.Votes)
	assert.Len(t, qe.Causes, 2)
	assert.Equal(t, redlease.KeyUnavailable, in.State, "not held, though the one node that answered holds it")
	assert.Len(t, in.Nodes, 3)

	_, err = l.ForceRelease(ctx, "outage", lk.Token())
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	assert.NotErrorIs(t, err, redlease.ErrNotHeld)
}
