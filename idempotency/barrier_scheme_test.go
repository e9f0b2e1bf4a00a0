package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/quorum"
)

// Two Barriers on one store and prefix, one on the store's own lock, one
// on a quorum of other nodes (a rolling move from the default lock to
// quorum): they share records but not locks. While one runs a request,
// the other's claim (its own lock granted, on its own nodes) finds the
// record in progress under the other lock scheme: it must answer
// ErrInProgress, never take the record over and run the request a second
// time. Forced order: the second call is made from inside the first
// call's handler. Both directions.
func TestBarriersOnTwoLockSchemesNeverRunARequestTwice(t *testing.T) {
	c := store(t)
	nodes := store(t) // the quorum's one node: not the store
	q, err := quorum.New([]redis.UniversalClient{nodes})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	onStore := barrier(t, c)
	onQuorum := barrier(t, c, idempotency.WithStrategy(q))
	ctx := t.Context()

	for i, pair := range [][2]*idempotency.Barrier{{onStore, onQuorum}, {onQuorum, onStore}} {
		first, second := pair[0], pair[1]
		req := idempotency.Request{Key: fmt.Sprintf("pay:schemes:%d", i)}
		var charges atomic.Int32
		out, err := first.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			charges.Add(1)
			_, derr := second.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
				charges.Add(1)
				return []byte("charged by the second"), nil
			})
			assert.ErrorIs(t, derr, idempotency.ErrInProgress, "pair %d: the other scheme's claim answers in progress", i)
			return []byte("charged by the first"), nil
		})
		assert.NoError(t, err, "pair %d: the first run is recorded", i)
		assert.Equal(t, "charged by the first", string(out.Result))
		assert.EqualValues(t, 1, charges.Load(), "pair %d: one charge", i)

		out, err = second.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			charges.Add(1)
			return nil, nil
		})
		require.NoError(t, err)
		assert.True(t, out.Replayed, "pair %d: the other scheme replays the first run", i)
		assert.Equal(t, "charged by the first", string(out.Result))
		assert.EqualValues(t, 1, charges.Load(), "pair %d: one charge", i)
	}
}

// A record in progress that names no lock scheme (written before records
// did, by an owner whose lock is gone) is taken over as before, through
// either scheme; the claim then records its own scheme.
func TestRecordWithoutASchemeIsTakenOverAsBefore(t *testing.T) {
	c := store(t)
	nodes := store(t)
	q, err := quorum.New([]redis.UniversalClient{nodes})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	ctx := t.Context()
	for i, b := range []*idempotency.Barrier{barrier(t, c), barrier(t, c, idempotency.WithStrategy(q))} {
		req := idempotency.Request{Key: fmt.Sprintf("pay:old-format:%d", i)}
		rec := "idem:r:" + req.Key
		require.NoError(t, c.HSet(ctx, rec, "state", "p", "owner", "crashed.1", "fence", "0", "fp", "").Err())
		require.NoError(t, c.Expire(ctx, rec, time.Hour).Err())
		var scheme string
		out, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			scheme = c.HGet(ctx, rec, "ls").Val()
			return []byte("ran"), nil
		})
		require.NoError(t, err, "Barrier %d takes the old record over", i)
		assert.False(t, out.Replayed)
		assert.NotEmpty(t, scheme, "Barrier %d records its scheme", i)
	}
}

// The single strategy given explicitly on the store's own client is the
// store's own lock (the same key on the same Redis): a record in progress
// that the default lock claimed, whose owner's lock is gone, is taken over
// through it, and the other way round.
func TestSingleOnTheStoreIsTheStoresOwnLockScheme(t *testing.T) {
	c := store(t)
	ctx := t.Context()
	byDefault := barrier(t, c)
	explicit := barrier(t, c, idempotency.WithStrategy(singleOn(t, c)))
	for i, pair := range [][2]*idempotency.Barrier{{byDefault, explicit}, {explicit, byDefault}} {
		req := idempotency.Request{Key: fmt.Sprintf("pay:same-scheme:%d", i)}
		rec := "idem:r:" + req.Key
		var scheme string
		_, err := pair[0].Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			scheme = c.HGet(ctx, rec, "ls").Val()
			// The owner dies: its lock goes, its record stays in progress.
			require.NoError(t, c.Del(ctx, requestLock("idem:", req.Key)).Err())
			require.NoError(t, c.HSet(ctx, rec, "owner", "crashed.1").Err())
			return nil, errors.New("never recorded: the owner crashed")
		})
		require.Error(t, err)
		assert.Equal(t, "store", scheme, "pair %d", i)
		require.NoError(t, c.HSet(ctx, rec, "state", "p", "owner", "crashed.1", "fence", "1", "fp", "", "ls", scheme).Err())
		out, err := pair[1].Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte("ran"), nil })
		require.NoError(t, err, "pair %d: taken over through the same scheme", i)
		assert.Equal(t, "ran", string(out.Result))
	}
}

// Placements name where a strategy takes a key: single and failover on
// one client the same, a quorum by its nodes whatever their order, and
// different nodes differently.
func TestPlacementsNameWhereKeysAreTaken(t *testing.T) {
	a, b := store(t), store(t)
	f, err := failover.New(a)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	quorumOn := func(nodes ...redis.UniversalClient) string {
		q, err := quorum.New(nodes)
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		return q.Placement()
	}
	assert.Equal(t, singleOn(t, a).Placement(), f.Placement(), "single and failover on one client")
	assert.NotEqual(t, singleOn(t, a).Placement(), singleOn(t, b).Placement())
	assert.Equal(t, quorumOn(a, b), quorumOn(b, a), "a quorum's placement does not depend on the order of its nodes")
	assert.NotEqual(t, quorumOn(a, b), quorumOn(a))
}
