package quorum

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
)

// TestCausesInNodeOrder: a QuorumError lists its per-node causes in node
// order whatever order the failures arrived in (failures at one instant
// arrive in the order their workers ran), after causes of no node, and
// without reordering the list it was given (a batch's items share it).
func TestCausesInNodeOrder(t *testing.T) {
	queued := redlease.ErrQueued
	n2 := &redlease.NodeError{Node: 2, Err: errors.New("two")}
	n0 := &redlease.NodeError{Node: 0, Err: errors.New("zero")}
	n1 := &redlease.NodeError{Node: 1, Err: errors.New("one")}
	in := []error{n2, n0, queued, n1}
	got := byNode(in)
	require.Equal(t, []error{queued, n0, n1, n2}, got)
	require.Equal(t, []error{n2, n0, queued, n1}, in, "the shared list is left as it was")
	require.Nil(t, byNode(nil))
}
