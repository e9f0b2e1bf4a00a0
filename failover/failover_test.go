package failover_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/contract"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/renew"
)

func TestMain(m *testing.M) {
	redistest.QuietClientLogs()
	goleak.VerifyTestMain(m)
}

const master = "locks"

// group is a primary, one replica and three Sentinels on loopback.
type group struct {
	primary, replica *redistest.Server
	sentinels        []*redistest.Sentinel
	client           *redis.Client // a failover client that follows the primary
}

func startGroup(t *testing.T) *group {
	t.Helper()
	g := &group{primary: redistest.Start(t, redistest.Config{})}
	g.replica = redistest.StartReplica(t, g.primary, redistest.Config{})
	g.sentinels = redistest.StartSentinels(t, g.primary, master, 3, 2, time.Second)
	g.client = redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: master, SentinelAddrs: redistest.Addrs(g.sentinels), ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = g.client.Close() })
	// Sentinel learns of the replica from the primary's INFO; wait for it.
	sc := g.sentinels[0].Client(t)
	probe := redistest.StartStallProbe(t)
	defer probe.Stop()
	probe.WaitFor(t, 15*time.Second, 3, 50*time.Millisecond, func() bool {
		reps, err := sc.Replicas(context.Background(), master).Result()
		return err == nil && len(reps) == 1 && !strings.Contains(reps[0]["flags"], "down")
	}, "Sentinel never saw the replica")
	return g
}

func TestContract(t *testing.T) {
	g := startGroup(t)
	// The contract's acquisitions must succeed: a WAIT timeout of 5 s, not
	// the default 100 ms, which a loaded machine's replica misses (the
	// ExtendBatch acquisition once, at load 20).
	s, err := failover.New(g.client, failover.WithWaitTimeout(5*time.Second))
	require.NoError(t, err)
	contract.Run(t, func(t *testing.T) contract.Setup {
		return contract.Setup{Strategy: s, Nodes: []redis.UniversalClient{g.client}, Quorum: 1, Fencing: true}
	})
}

func TestRejectsBadInput(t *testing.T) {
	ctx := t.Context()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { _ = cc.Close() })
	for name, tc := range map[string]struct {
		client redis.UniversalClient
		opts   []failover.Option
	}{
		"nil client":      {nil, nil},
		"typed nil":       {(*redis.Client)(nil), nil},
		"zero replicas":   {c, []failover.Option{failover.WithReplicas(0)}},
		"zero wait":       {c, []failover.Option{failover.WithWaitTimeout(0)}},
		"drift factor -1": {c, []failover.Option{failover.WithDriftFactor(-1)}},
		"empty master":    {c, []failover.Option{failover.WithMaster("")}},
		"master w/ space": {c, []failover.Option{failover.WithMaster("my master")}},
		"master w/ ctrl":  {c, []failover.Option{failover.WithMaster("m\n")}},
	} {
		s, err := failover.New(tc.client, tc.opts...)
		assert.ErrorIs(t, err, redlease.ErrInvalid, name)
		assert.Nil(t, s, name)
	}
	strategy, err := failover.New(c)
	require.NoError(t, err)
	_, err = failover.NewWatcher(ctx, strategy, "", 0)
	assert.ErrorIs(t, err, redlease.ErrInvalid)

	// A strategy that names its master is watched under that name only
	// (the Sentinel client is never dialled).
	named, err := failover.New(c, failover.WithMaster("payments"))
	require.NoError(t, err)
	assert.Equal(t, "failover payments", named.Placement())
	assert.Equal(t, "payments", named.Master())
	sc := redis.NewSentinelClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = sc.Close() })
	_, err = failover.NewWatcher(ctx, named, "ledger", 0, sc)
	assert.ErrorIs(t, err, redlease.ErrInvalid)
	assert.ErrorContains(t, err, `WithMaster("payments")`)
}

// A replica that does not answer (paused) must make the acquisition fail
// (an outage: ErrUnavailable, not ErrNotObtained) instead of granting a
// lock only the primary has, and leave no key.
func TestUnacknowledgedGrantIsRefused(t *testing.T) {
	g := startGroup(t)
	s, err := failover.New(g.client, failover.WithWaitTimeout(100*time.Millisecond))
	require.NoError(t, err)
	ctx, key := t.Context(), contract.Key(t)

	g.replica.Pause()
	t.Cleanup(g.replica.Resume)
	_, err = s.Acquire(ctx, key, "tok", 5*time.Second)
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	assert.NotErrorIs(t, err, redlease.ErrNotObtained)
	assert.ErrorIs(t, err, failover.ErrNotReplicated)
	n, err := g.client.Exists(ctx, key).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the unacknowledged grant must be undone")

	g.replica.Resume()
	_, err = s.Acquire(ctx, key, "tok", 5*time.Second)
	assert.NoError(t, err, "granted again once the replica answers")
}

// After a forced Sentinel failover the holder's Lost closes within a second
// of the new primary being known, and the next holder gets a higher fence
// (the fence counter was replicated under WAIT).
func TestFailoverRevokesHoldersAndFencesRise(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	g := startGroup(t)
	s, err := failover.New(g.client)
	require.NoError(t, err)
	w, err := renew.New()
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	sc := g.sentinels[0].Client(t)
	scs := []*redis.SentinelClient{sc, g.sentinels[1].Client(t), g.sentinels[2].Client(t)}
	watcher, err := failover.NewWatcher(t.Context(), s, master, 100*time.Millisecond, scs...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = watcher.Close() })
	old := watcher.Primary()

	locker, err := redlease.New(s, redlease.WithTTL(10*time.Second), redlease.WithKeeper(w))
	require.NoError(t, err)
	ctx, key := t.Context(), contract.Key(t)
	a, err := locker.TryLock(ctx, key)
	require.NoError(t, err)
	lost := a.Lost()

	require.NoError(t, sc.Failover(ctx, master).Err())
	var moved time.Time
	probe.WaitFor(t, 15*time.Second, 3, 10*time.Millisecond, func() bool {
		addr, err := sc.GetMasterAddrByName(ctx, master).Result()
		if err == nil && addr[0]+":"+addr[1] != old {
			moved = time.Now()
			return true
		}
		return false
	}, "Sentinel never moved the primary")

	redistest.Await(t, probe, lost, time.Second, 3, "Lost did not close after the failover")
	t.Logf("holder told %v after Sentinel named the new primary (negative: before)", time.Since(moved).Round(time.Millisecond))
	assert.ErrorIs(t, a.Err(), failover.ErrFailover)
	// The Watcher counts a revocation once RevokeAll returned, after it
	// closed the holder's Lost: the count may lag the channel.
	probe.WaitFor(t, 5*time.Second, 3, time.Millisecond, func() bool { return watcher.Revoked() == 1 }, "the Watcher counts the one lock it revoked")

	// The old holder lets go on the new primary; the next holder needs the
	// old primary, now a replica, to acknowledge: retry until it does.
	require.NoError(t, a.Release(ctx))
	// Sentinel turns the old primary into a replica of the new one on its
	// next look at it, up to ten seconds later; do it now, as Sentinel will.
	newAddr := watcher.Primary()
	host, port, _ := strings.Cut(newAddr, ":")
	require.NoError(t, g.primary.Client().ReplicaOf(ctx, host, port).Err())
	probe.WaitFor(t, 10*time.Second, 3, 20*time.Millisecond, func() bool {
		info, err := g.client.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "connected_slaves:1")
	}, "old primary never replicated the new one")
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	b, err := locker.Lock(lctx, key)
	require.NoError(t, err)
	assert.Greater(t, b.Fence(), a.Fence(), "the fence counter survived the failover")
	require.NoError(t, b.Release(ctx))
}
