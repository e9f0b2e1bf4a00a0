package bench_test

import (
	"errors"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/contract"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
)

// interopNodeTimeout is TestRedsyncInterop's quorum node timeout: long
// enough that every node's reply arrives (100 ms, the default, was missed
// by three nodes at load 12), shorter than the test's timeout.
const interopNodeTimeout = 30 * time.Second

// A redsync mutex and a redlease lock on the same name and nodes exclude
// each other, both ways, so a fleet can move from one to the other.
func TestRedsyncInterop(t *testing.T) {
	servers := redistest.StartN(t, 5, redistest.Config{})
	clients := make([]*redis.Client, len(servers))
	for i, srv := range servers {
		clients[i] = srv.Client()
	}
	// The test is about exclusion, not time: a node that answers late must
	// still answer (a reply missed for the node timeout is ErrUnavailable,
	// which says nothing about who holds), so the node timeout is longer
	// than any stall a loaded machine shows, and a reply is what decides.
	s, err := quorum.New(universal(clients), quorum.WithFencing(), quorum.WithNodeTimeout(interopNodeTimeout))
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	rs := redsync.New(pools(clients)...)
	locker, err := redlease.New(s, redlease.WithTTL(5*time.Second))
	require.NoError(t, err)
	ctx := t.Context()

	t.Run("redsync holds, redlease waits", func(t *testing.T) {
		name := contract.Key(t)
		m := rs.NewMutex(name, redsync.WithExpiry(5*time.Second), redsync.WithTries(1))
		require.NoError(t, m.LockContext(ctx))
		_, err := locker.TryLock(ctx, name)
		assert.ErrorIs(t, err, redlease.ErrNotObtained)
		ok, err := m.UnlockContext(ctx)
		require.NoError(t, err)
		require.True(t, ok)
		lk, err := locker.TryLock(ctx, name)
		require.NoError(t, err, "free once redsync unlocked")
		require.NoError(t, lk.Release(ctx))
	})

	t.Run("redlease holds, redsync waits", func(t *testing.T) {
		name := contract.Key(t)
		lk, err := locker.TryLock(ctx, name)
		require.NoError(t, err)
		m := rs.NewMutex(name, redsync.WithExpiry(5*time.Second), redsync.WithTries(1))
		err = m.LockContext(ctx)
		var taken *redsync.ErrTaken
		assert.True(t, errors.As(err, &taken), "redsync must see the lock taken: %v", err)
		require.NoError(t, lk.Release(ctx))
		require.NoError(t, m.LockContext(ctx), "free once redlease released")
		_, err = m.UnlockContext(ctx)
		require.NoError(t, err)
	})
}
