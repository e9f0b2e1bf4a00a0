package idempotency_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
)

// sentinelMaster starts a primary with one replica and one Sentinel
// monitoring it as master, and returns a redis.NewFailoverClient for it
// (its address, as go-redis reports it, is "FailoverClient" whatever the
// master) with its Sentinel's address.
func sentinelMaster(t *testing.T, master string) *redis.Client {
	t.Helper()
	primary := redistest.Start(t, redistest.Config{})
	redistest.StartReplica(t, primary, redistest.Config{})
	sentinels := redistest.StartSentinels(t, primary, master, 1, 1, time.Minute)
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: master, SentinelAddrs: redistest.Addrs(sentinels), ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Two Barriers on one store and prefix whose locks live on two different
// Sentinel masters, each through a failover strategy over a
// redis.NewFailoverClient: their locks exclude nothing between them, and
// their fences come from two unrelated counters. While one runs a request,
// the other's claim (its lock granted on its own master, under a fence its
// counter made higher) must answer ErrInProgress, never take the record
// over and charge a second time. Each strategy names its master
// (failover.WithMaster), which tells the two lock schemes apart. Forced
// order: the second call is made from inside the first call's handler,
// after released runs on each master made the second's fence counter the
// higher (a counter created anew starts from its server's clock: master
// b's is created after master a's).
func TestBarriersOnTwoSentinelMastersNeverRunARequestTwice(t *testing.T) {
	store := store(t)
	ctx := t.Context()
	onMaster := func(master string) *idempotency.Barrier {
		fs, err := failover.New(sentinelMaster(t, master), failover.WithMaster(master))
		require.NoError(t, err)
		t.Cleanup(func() { _ = fs.Close() })
		return barrier(t, store, idempotency.WithStrategy(fs), idempotency.WithLease(5*time.Second))
	}
	a, b := onMaster("master-a"), onMaster("master-b")
	req := idempotency.Request{Key: "pay:two-masters"}

	// Runs that fail (not Final) release the request: one on master a,
	// then two on master b, whose counter is created later and so stands
	// higher.
	var highestB uint64
	declined := func(_ context.Context, fence uint64) ([]byte, error) {
		highestB = fence
		return nil, errors.New("declined for now")
	}
	_, err := a.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return nil, errors.New("declined for now") })
	require.Error(t, err)
	for range 2 {
		_, err := b.Do(ctx, req, declined)
		require.Error(t, err)
	}

	var charges atomic.Int32
	var secondErr error
	out, err := a.Do(ctx, req, func(_ context.Context, fence uint64) ([]byte, error) {
		charges.Add(1)
		assert.Less(t, fence, highestB, "the forced order: master b's next fence is above master a's")
		_, secondErr = b.Do(ctx, req, func(_ context.Context, fence uint64) ([]byte, error) {
			charges.Add(1)
			return []byte("charged on master b"), nil
		})
		return []byte("charged on master a"), nil
	})
	assert.ErrorIs(t, secondErr, idempotency.ErrInProgress, "master b's claim answers in progress")
	assert.EqualValues(t, 1, charges.Load(), "one charge")
	require.NoError(t, err, "master a's run is recorded")
	assert.Equal(t, "charged on master a", string(out.Result))

	out, err = b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
		charges.Add(1)
		return nil, nil
	})
	require.NoError(t, err)
	assert.True(t, out.Replayed, "master b replays master a's run")
	assert.Equal(t, "charged on master a", string(out.Result))
	assert.EqualValues(t, 1, charges.Load(), "one charge")
}

// A lock strategy whose placement does not say where its locks live is
// refused: failover or single over a redis.NewFailoverClient ("primary
// FailoverClient" for every master), or a quorum with such a node. Named
// by failover.WithMaster, the failover strategy is accepted; the default
// lock on a NewFailoverClient store is the store's own. The clients are
// never dialled.
func TestStrategiesThatCannotNameTheirMasterAreRefused(t *testing.T) {
	fc := func(master string) *redis.Client {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: []string{"127.0.0.1:1"}})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	st := fc("store")
	bare, err := failover.New(fc("a"))
	require.NoError(t, err)
	assert.Equal(t, "primary FailoverClient", bare.Placement())
	q, err := quorum.New([]redis.UniversalClient{store(t), fc("b"), store(t)}, quorum.WithFencing())
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	for _, s := range []redlease.Strategy{bare, singleOn(t, fc("c")), q, singleOn(t, st)} {
		_, err := idempotency.New(st, idempotency.WithStrategy(s))
		require.ErrorIs(t, err, redlease.ErrInvalid, "%T %s", s, s.(redlease.Placer).Placement())
		assert.ErrorContains(t, err, "failover.WithMaster")
	}

	named, err := failover.New(fc("a"), failover.WithMaster("a"))
	require.NoError(t, err)
	assert.Equal(t, "failover a", named.Placement())
	_, err = idempotency.New(st, idempotency.WithStrategy(named))
	require.NoError(t, err)
	_, err = idempotency.New(st)
	require.NoError(t, err, "the default lock on the store")
}
