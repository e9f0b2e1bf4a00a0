package chaos

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/single"
)

// countingBatch is single's strategy with its ExtendBatch calls (the
// watchdog's ticks) counted: in flight, and with their items once each
// returns.
type countingBatch struct {
	*single.Strategy
	inflight, ticks, items atomic.Int64
}

// ExtendBatch extends items through single and counts the call.
func (c *countingBatch) ExtendBatch(ctx context.Context, items []redlease.Extension) []redlease.Extended {
	c.inflight.Add(1)
	defer c.inflight.Add(-1)
	out := c.Strategy.ExtendBatch(ctx, items)
	c.items.Add(int64(len(items)))
	c.ticks.Add(1)
	return out
}

// scriptCalls is how many script calls (EVALSHA and EVAL) s has served
// since it started, from INFO commandstats.
func scriptCalls(ctx context.Context, t *testing.T, s *redistest.Server) int64 {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	info, err := c.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	var n int64
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		for _, cmd := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(line, cmd); ok {
				calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				v, err := strconv.ParseInt(calls, 10, 64)
				require.NoError(t, err, "%s %q", cmd, line)
				n += v
			}
		}
	}
	return n
}

// Script calls per master per watchdog tick on a Cluster: 1,000 locks with
// keys over all slots of a 3-master Cluster, kept by a renew.Watchdog with
// single. After the batches settle, the script calls each master served
// over a fixed number of ticks (INFO commandstats, read right after a tick
// returned, so no tick is cut in two) are divided by the ticks and by the
// share of the 1,000 locks they renewed. It prints the figure and asserts
// that the measurement ran (ticks seen, locks renewed) and that each
// master served at most one call per tick per script.MaxBatch of its locks
// (renewals per master, not per slot; a call per slot was 327–343 per
// master per tick). Runs with -chaos.full.
func TestClusterRenewalScriptCallsPerMaster(t *testing.T) {
	if !*full {
		t.Skip("measurement: runs in `make chaos` (go test -chaos.full)")
	}
	ctx := t.Context()
	probe := redistest.StartStallProbe(t)
	const locks, ttl, measured = 1000, 3 * time.Second, 5
	masters := redistest.StartCluster(t, 3)
	cc := redistest.ClusterClient(t, masters)
	s, err := single.New(cc)
	require.NoError(t, err)
	cs := &countingBatch{Strategy: s}
	locker, err := redlease.New(cs, redlease.WithTTL(ttl), redlease.WithPrefix("rn:"))
	require.NoError(t, err)
	w := watchdog(t)

	held := make([]*redlease.Lock, locks)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < locks; i += 16 {
				lk, err := locker.TryLock(ctx, strconv.Itoa(i))
				if err != nil {
					failed.Add(1)
					continue
				}
				held[i] = lk
			}
		})
	}
	wg.Wait()
	require.Zero(t, failed.Load(), "every lock taken")
	for _, lk := range held {
		stop := w.Keep(lk)
		t.Cleanup(stop)
	}
	slots := map[int64]bool{}
	slotsOf := map[string]int{}
	for i := range locks {
		slot, err := cc.ClusterKeySlot(ctx, "rn:"+strconv.Itoa(i)).Result()
		require.NoError(t, err)
		if !slots[slot] {
			slots[slot] = true
			m, err := cc.MasterForKey(ctx, "rn:"+strconv.Itoa(i))
			require.NoError(t, err)
			slotsOf[m.Options().Addr]++
		}
	}

	// waitTicks returns once n ticks more than seen have returned: within
	// 20 TTLs a tick, widened by 3 × the stall this run measured meanwhile
	// (probe.WaitFor).
	waitTicks := func(seen, n int64) {
		probe.WaitFor(t, 20*ttl*time.Duration(n), 3, time.Millisecond, func() bool { return cs.ticks.Load() >= seen+n },
			"fewer than %d watchdog ticks after tick %d: %s", n, seen, redistest.Lazy(func() string {
				return fmt.Sprintf("%d returned", cs.ticks.Load()-seen)
			}))
	}
	// snapshot reads every master's script calls between two ticks: with
	// no tick in flight, and none begun or ended during the reads.
	snapshot := func() (calls []int64, ticks, items int64) {
		for {
			for cs.inflight.Load() != 0 {
				time.Sleep(100 * time.Microsecond)
			}
			ticks, items = cs.ticks.Load(), cs.items.Load()
			calls = make([]int64, len(masters))
			for i, m := range masters {
				calls[i] = scriptCalls(ctx, t, m)
			}
			if cs.inflight.Load() == 0 && cs.ticks.Load() == ticks {
				return calls, ticks, items
			}
		}
	}
	waitTicks(0, 4) // let the batches settle (renew's doc: one batch per 3/4 interval)
	before, ticks0, items0 := snapshot()
	waitTicks(ticks0, measured)
	after, ticks1, items1 := snapshot()
	ticks, items := ticks1-ticks0, items1-items0
	var parts []string
	for i, m := range masters {
		calls := after[i] - before[i]
		perTick := float64(calls) / float64(ticks)
		perRound := float64(calls) / (float64(items) / locks)
		parts = append(parts, fmt.Sprintf("%s (%d slots with a lock): %.1f calls/tick, %.1f per renewal of all %d locks",
			m.Addr, slotsOf[m.Addr], perTick, perRound, locks))
		require.LessOrEqual(t, perRound, float64(locks/script.MaxBatch+1), "script calls per master per renewal of all locks: one per script.MaxBatch keys")
	}
	for _, lk := range held {
		require.True(t, lk.Valid(), "lock %s kept", lk.Key())
	}
	require.Positive(t, items, "locks renewed while measured")
	t.Logf("figures: %d locks over %d slots, %d ticks renewing %d locks (%.0f per tick); script calls per master: %s",
		locks, len(slots), ticks, items, float64(items)/float64(ticks), strings.Join(parts, "; "))
}
