package single_test

import (
	"fmt"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/single"
)

// Batches on a real three-master Cluster: every master gets its own batch,
// so one master's trouble costs its own keys only.
func TestExtendBatchOnClusterPerShard(t *testing.T) {
	servers := redistest.StartCluster(t, 3)
	cc := redistest.ClusterClient(t, servers)
	byAddr := map[string]*redistest.Server{}
	for _, srv := range servers {
		byAddr[srv.Addr] = srv
	}
	// masterOf returns the server that holds key.
	masterOf := func(t *testing.T, key string) *redistest.Server {
		t.Helper()
		m, err := cc.MasterForKey(t.Context(), key)
		require.NoError(t, err)
		srv := byAddr[m.Options().Addr]
		require.NotNil(t, srv, "master %s of %q", m.Options().Addr, key)
		return srv
	}

	t.Run("wrong type on one master", func(t *testing.T) {
		ctx := t.Context()
		strategy, err := single.New(cc)
		require.NoError(t, err)
		locker, err := redlease.New(strategy, redlease.WithPrefix("cwt:"), redlease.WithTTL(10*time.Second))
		require.NoError(t, err)
		locks := make([]*redlease.Lock, 30)
		for i := range locks {
			lk, err := locker.TryLock(ctx, fmt.Sprint(i))
			require.NoError(t, err)
			locks[i] = lk
		}
		const bad = 4
		replaceWithHash(t, cc, "cwt:4")
		errs := redlease.ExtendAll(ctx, locks)
		for i, err := range errs {
			if i != bad {
				assert.NoError(t, err, "lock %d on %s", i, masterOf(t, "cwt:"+fmt.Sprint(i)).Addr)
			}
		}
		require.ErrorIs(t, errs[bad], redlease.ErrNotHeld)
		var ne *redlease.NodeError
		require.ErrorAs(t, errs[bad], &ne)
		assert.True(t, redis.HasErrorPrefix(ne.Err, "WRONGTYPE"), "cause: %v", ne.Err)
		assert.Equal(t, masterOf(t, "cwt:4").Addr, ne.Addr, "the cause names the master that holds the key")
	})

	t.Run("one script call per slot and 500 keys", func(t *testing.T) {
		ctx := t.Context()
		s, err := single.New(cc)
		require.NoError(t, err)
		items := make([]redlease.Extension, 600)
		for i := range items { // one hash tag: one slot, one master
			items[i] = redlease.Extension{Key: fmt.Sprintf("{slot}:%d", i), Token: "tok", TTL: 20 * time.Second}
			require.NoError(t, cc.Set(ctx, items[i].Key, "tok", 10*time.Second).Err())
		}
		for i, r := range s.ExtendBatch(ctx, items) { // loads the script where it is missing
			require.NoError(t, r.Err, "item %d", i)
		}
		m := masterOf(t, "{slot}")
		admin := m.Client()
		require.NoError(t, admin.ConfigResetStat(ctx).Err())
		for i, r := range s.ExtendBatch(ctx, items) {
			require.NoError(t, r.Err, "item %d", i)
		}
		assert.Equal(t, 2, scriptCalls(t, admin), "600 keys of one slot: two calls of 500 and 100")
	})

	t.Run("paused master", func(t *testing.T) {
		ctx := t.Context()
		const ttl = 5 * time.Second
		strategy2, err := single.New(cc)
		require.NoError(t, err)
		locker, err := redlease.New(strategy2, redlease.WithPrefix("cpm:"), redlease.WithTTL(ttl))
		require.NoError(t, err)
		victim := servers[0]
		var locks []*redlease.Lock
		onVictim := map[int]bool{}
		count := map[string]int{}
		for i := 0; count[servers[0].Addr] < 5 || count[servers[1].Addr] < 5 || count[servers[2].Addr] < 5; i++ {
			key := fmt.Sprint(i)
			srv := masterOf(t, "cpm:"+key)
			count[srv.Addr]++
			lk, err := locker.TryLock(ctx, key)
			require.NoError(t, err)
			onVictim[len(locks)] = srv == victim
			locks = append(locks, lk)
		}
		bctx, cancel := withDeadlineOf(t, locks) // as the watchdog bounds a batch
		defer cancel()
		deadline, _ := bctx.Deadline()

		probe := redistest.StartStallProbe(t)
		victim.Pause()
		t.Cleanup(victim.Resume)
		start := time.Now()
		errs := redlease.ExtendAll(bctx, locks)
		elapsed := time.Since(start)
		t.Logf("ExtendAll over %d locks with %s paused: %v (ctx allowed %v)", len(locks), victim.Addr, elapsed.Round(time.Millisecond), deadline.Sub(start).Round(time.Millisecond))
		for i, err := range errs {
			if onVictim[i] {
				continue
			}
			assert.NoError(t, err, "lock %d: its master answered", i)
			assert.True(t, locks[i].Valid(), "lock %d: a healthy master's lock stays held", i)
			assert.False(t, lostNow(locks[i]), "lock %d", i)
		}
		for i, err := range errs {
			if !onVictim[i] {
				continue
			}
			assert.ErrorIs(t, err, redlease.ErrUnavailable, "lock %d: the paused master said nothing", i)
			assert.NotErrorIs(t, err, redlease.ErrNotHeld, "lock %d: silence is no proof of loss", i)
			var ne *redlease.NodeError
			if assert.ErrorAs(t, err, &ne, "lock %d", i) {
				assert.Equal(t, victim.Addr, ne.Addr, "lock %d: the cause names the paused master", i)
			}
			assert.True(t, locks[i].Valid(), "lock %d: undecided keeps the previous Until", i)
		}
		for i := range errs {
			if onVictim[i] {
				t.Logf("lock %d: %v", i, errs[i])
				break
			}
		}
		// The bound: the earliest Until less a tenth of the TTL (the group
		// runs until its locks' Until less the loss margin); the window adds
		// 3 × what this process was measured stalled (the others' results,
		// checked exactly above, counted in any case).
		ok, why := probe.Within(elapsed, deadline.Sub(start)-ttl/10, 3, start)
		assert.True(t, ok, "the paused master's batch ends on its own deadline, early enough for the others' results to count: %s", why)

		victim.Resume()
		rctx, rcancel := withDeadlineOf(t, locks)
		defer rcancel()
		for i, err := range redlease.ExtendAll(rctx, locks) {
			assert.NoError(t, err, "lock %d, after the master came back", i)
		}
	})
}

// scriptCalls reads how many EVALSHA and EVAL calls a server ran since its
// last CONFIG RESETSTAT.
func scriptCalls(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(t.Context(), "commandstats").Result()
	require.NoError(t, err)
	n := 0
	for _, m := range regexp.MustCompile(`cmdstat_(?:evalsha|eval):calls=(\d+)`).FindAllStringSubmatch(info, -1) {
		v, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		n += v
	}
	return n
}
