package single_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/single"
)

// On a Cluster client a set is taken in one step only when its keys share
// a slot: Together accepts keys with one hash tag and refuses keys of
// different slots, and AcquireSet takes the tagged set on its master
// (each key fenced) and refuses the others before sending anything.
func TestSetTogetherOnClusterIsOneSlot(t *testing.T) {
	servers := redistest.StartCluster(t, 3)
	c := redistest.ClusterClient(t, servers)
	s, err := single.New(c)
	require.NoError(t, err)
	ctx := t.Context()
	tagged := []string{"{acct}:alice", "{acct}:bob"}
	apart := []string{"acct:alice", "acct:bob"} // slots 6714 and 562
	assert.True(t, s.Together(tagged))
	assert.False(t, s.Together(apart))

	grants, _, err := s.AcquireSet(ctx, tagged, "tok_C.1", 5*time.Second)
	require.NoError(t, err)
	require.Len(t, grants, 2)
	for i, key := range tagged {
		assert.NotZero(t, grants[i].Fence, key)
		assert.Equal(t, "tok_C.1", c.Get(ctx, key).Val(), key)
	}
	_, _, err = s.AcquireSet(ctx, apart, "tok_C.1", 5*time.Second)
	require.ErrorIs(t, err, redlease.ErrInvalid)
	assert.Zero(t, c.Exists(ctx, apart[0]).Val()+c.Exists(ctx, apart[1]).Val(), "nothing sent")
}
