package single_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/single"
)

// Down is not held: a TryLock on a dead node matches ErrUnavailable and
// not ErrNotObtained, in one line with one "redlease:" prefix; one on a
// held key matches ErrNotObtained only.
func TestDownIsNotHeld(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	strategy, err := single.New(srv.Client())
	require.NoError(t, err)
	l, err := redlease.New(strategy)
	require.NoError(t, err)
	ctx := t.Context()
	held, err := l.TryLock(ctx, "defaults:held")
	require.NoError(t, err)
	_, err = l.TryLock(ctx, "defaults:held")
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.NotErrorIs(t, err, redlease.ErrUnavailable)
	require.NoError(t, held.Release(ctx))

	srv.Kill()
	_, err = l.TryLock(ctx, "defaults:down")
	require.NotErrorIs(t, err, redlease.ErrNotObtained, "down is not held")
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	var ne *redlease.NodeError
	require.ErrorAs(t, err, &ne)
	assert.NotContains(t, err.Error(), "\n", "one line")
	assert.Equal(t, 1, strings.Count(err.Error(), "redlease:"), "one prefix: %s", err)
	t.Log(err)
}
