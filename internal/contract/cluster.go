package contract

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/renew"
)

// NewOnCluster builds the strategy under test on a Cluster client.
type NewOnCluster func(*redis.ClusterClient) (redlease.Strategy, error)

// ClusterCallsBounded checks that every call of the strategy on a Cluster
// client returns by its ctx deadline, with ContextTimeoutEnabled on and
// off, when the key's master is paused and when it is killed: TryLock, Lock
// and Do on a new key of that master, and Extend, ExtendAll and Release of a
// lock held there, each with redistest.CallTimeout, on a client that has
// been in use (topology and COMMAND known); and that a failure names the
// key's master. A Cluster of three masters without replicas, a new one per
// case.
func ClusterCallsBounded(t *testing.T, newStrategy NewOnCluster) {
	for _, fault := range []string{"paused", "killed"} {
		for _, cte := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s master, ContextTimeoutEnabled %v", fault, cte), func(t *testing.T) {
				probe := redistest.StartStallProbe(t)
				servers := redistest.StartCluster(t, 3)
				addrs := make([]string, len(servers))
				for i, s := range servers {
					addrs[i] = s.Addr
					t.Cleanup(s.Resume)
				}
				c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: cte})
				t.Cleanup(func() { _ = c.Close() })
				l := clusterLocker(t, c, newStrategy, 10*time.Second)
				ctx := t.Context()
				held, err := l.TryLock(ctx, "{bounded}:held")
				if err != nil {
					t.Fatalf("TryLock before the fault: %v", err)
				}
				m, err := c.MasterForKey(ctx, "{bounded}:held")
				if err != nil {
					t.Fatalf("master for the key: %v", err)
				}
				var victim *redistest.Server
				for _, s := range servers {
					if s.Addr == m.Options().Addr {
						victim = s
					}
				}
				if victim == nil {
					t.Fatalf("the key's master %s is not one of the cluster's", m.Options().Addr)
				}
				if fault == "paused" {
					victim.Pause()
				} else {
					victim.Kill()
					// go-redis redials a dead address from a goroutine of
					// its own (pool.tryDial), which sleeps 1 s between
					// dials and ends at the first one after its client
					// closed: close it, then wait, bounded.
					t.Cleanup(func() {
						_ = c.Close()
						waitRedialsEnd(t, 3*time.Second)
					})
				}
				timed := redistest.BoundedCalls(ctx, t, probe)
				unavailable := func(what string, err error) {
					t.Helper()
					if !errors.Is(err, redlease.ErrUnavailable) {
						t.Errorf("%s: %v, want ErrUnavailable", what, err)
					}
				}
				err = timed("TryLock", func(c context.Context) error { _, err := l.TryLock(c, "{bounded}:new"); return err })
				unavailable("TryLock", err)
				var ne *redlease.NodeError
				if !errors.As(err, &ne) {
					t.Errorf("TryLock: %v carries no *redlease.NodeError", err)
				} else if ne.Addr != victim.Addr {
					t.Errorf("TryLock's failure names %s, want the key's master %s", ne.Addr, victim.Addr)
				}
				err = timed("Lock", func(c context.Context) error { _, err := l.Lock(c, "{bounded}:new"); return err })
				unavailable("Lock", err)
				err = timed("Do", func(c context.Context) error {
					return l.Do(c, "{bounded}:new", func(context.Context, *redlease.Lock) error { return nil })
				})
				unavailable("Do", err)
				err = timed("Extend", func(c context.Context) error { return held.Extend(c, 10*time.Second) })
				unavailable("Extend", err)
				err = timed("ExtendAll", func(c context.Context) error { return redlease.ExtendAll(c, []*redlease.Lock{held})[0] })
				unavailable("ExtendAll", err)
				if err = timed("Release", func(c context.Context) error { return held.Release(c) }); err == nil {
					t.Errorf("Release on a %s master succeeded", fault)
				}
			})
		}
	}
}

// ClusterFailoverKeeps checks that a lock whose Cluster master fails over
// to a replica that has it is kept: the replica has caught up, the master
// is killed (so nobody answers MOVED), and the replica is promoted with
// CLUSTER FAILOVER TAKEOVER, seen through another client; the holder's
// client is told nothing (go-redis reloads its topology by itself only on
// MOVED or every 60 s). The lock, kept by a watchdog, must still be valid
// half a TTL past the Until it had at the promotion, renewed on the new
// master. A Cluster of three masters with a replica each.
func ClusterFailoverKeeps(t *testing.T, newStrategy NewOnCluster) {
	probe := redistest.StartStallProbe(t)
	cl := redistest.StartClusterWithReplicas(t, 3, 1)
	c, other := cl.Client(), cl.Client()
	wd, err := renew.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = wd.Close() })
	const ttl = 6 * time.Second
	l := clusterLocker(t, c, newStrategy, ttl, redlease.WithKeeper(wd))
	ctx := t.Context()
	const key = "failover:kept"
	lk, err := l.TryLock(ctx, key)
	if err != nil {
		t.Fatalf("TryLock: %v", err)
	}
	stop := wd.Keep(lk)
	defer stop()
	m := cl.MasterOf(ctx, c, key)
	r := cl.ReplicaOf(m)
	probe.WaitFor(t, 5*time.Second, 3, 5*time.Millisecond, func() bool { return cl.Lag(m, r) == 0 }, "replica %s to catch up with %s", r.Addr, m.Addr)
	if got, err := r.ReadOnlyGet(ctx, key); err != nil || got != lk.Token() {
		t.Fatalf("the replica holds %q (%v) before the failover, want the lock's token", got, err)
	}

	m.Kill()
	promoted := cl.Takeover(r, other, key)
	until := lk.Until()
	t.Logf("master %s killed, %s promoted; the lock's Until %v after the promotion", m.Addr, r.Addr, until.Sub(promoted).Round(time.Millisecond))
	// Past the Until the lock had at the promotion, by half a TTL: a lock
	// nobody renewed on the new master is over by then.
	time.Sleep(time.Until(until) + ttl/2)
	select {
	case <-lk.Lost():
		t.Fatalf("the lock was lost although %s, promoted, held it: %v", r.Addr, lk.Err())
	default:
	}
	if !lk.Valid() {
		t.Errorf("the lock is not valid %v after its Until at the promotion", time.Since(until).Round(time.Millisecond))
	}
	if !lk.Until().After(until) {
		t.Errorf("not renewed on the new master: Until %v, at the promotion %v", lk.Until(), until)
	}
	intruder := clusterLocker(t, other, newStrategy, ttl)
	if _, err := intruder.TryLock(ctx, key); !errors.Is(err, redlease.ErrNotObtained) {
		t.Errorf("another client's TryLock: %v, want ErrNotObtained (held)", err)
	}
}

// clusterLocker is a polling Locker on a strategy newStrategy builds on c.
func clusterLocker(t *testing.T, c *redis.ClusterClient, newStrategy NewOnCluster, ttl time.Duration, opts ...redlease.Option) *redlease.Locker {
	t.Helper()
	s, err := newStrategy(c)
	if err != nil {
		t.Fatalf("strategy: %v", err)
	}
	l, err := redlease.New(s, append([]redlease.Option{redlease.WithPolling(), redlease.WithTTL(ttl)}, opts...)...)
	if err != nil {
		t.Fatalf("locker: %v", err)
	}
	return l
}

// waitRedialsEnd waits at most limit for every goroutine of go-redis's
// redial probe (pool.(*ConnPool).tryDial) to end, and fails tb if one is
// left: a closed client's probe ends at its next wake, a second at most.
func waitRedialsEnd(tb testing.TB, limit time.Duration) {
	tb.Helper()
	buf := make([]byte, 1<<20)
	for end := time.Now().Add(limit); ; {
		n := runtime.Stack(buf, true)
		if !strings.Contains(string(buf[:n]), "(*ConnPool).tryDial") {
			return
		}
		if time.Now().After(end) {
			tb.Errorf("a go-redis redial probe still runs %v after its client closed", limit)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ClusterHalfMigratedKeeps checks that a slot left half migrated (an
// interrupted resharding: one of two locks' keys in the slot moved to the
// importing master, the other still on the migrating one) costs neither
// lock: one batch renewal of both extends both, the one that stayed on the
// migrating master and the moved one on the importing master (ASKING). A
// Cluster of three masters with replicas replicas each.
func ClusterHalfMigratedKeeps(t *testing.T, replicas int, newStrategy NewOnCluster) {
	cl := redistest.StartClusterWithReplicas(t, 3, replicas)
	c := cl.Client()
	ctx := t.Context()
	s, err := newStrategy(c)
	if err != nil {
		t.Fatalf("strategy: %v", err)
	}
	b, ok := s.(redlease.BatchExtender)
	if !ok {
		t.Fatalf("%T renews no batch", s)
	}
	const stay, move = "{half}stay", "{half}move"
	for _, k := range []string{stay, move} {
		if _, err := s.Acquire(ctx, k, "tok-"+k, 5*time.Second); err != nil {
			t.Fatalf("Acquire %s: %v", k, err)
		}
	}
	slot, err := c.ClusterKeySlot(ctx, stay).Result()
	if err != nil {
		t.Fatal(err)
	}
	src := cl.MasterOf(ctx, c, stay)
	var dst *redistest.Server
	for _, m := range cl.Masters {
		if m != src {
			dst = m
			break
		}
	}
	redistest.HalfMigrate(t, src, dst, int(slot), move)

	out := b.ExtendBatch(ctx, []redlease.Extension{
		{Key: stay, Token: "tok-" + stay, TTL: 30 * time.Second},
		{Key: move, Token: "tok-" + move, TTL: 30 * time.Second},
	})
	for i, o := range out {
		if o.Err != nil {
			t.Fatalf("item %d: %v", i, o.Err)
		}
	}
	if ttl, err := src.Client().PTTL(ctx, stay).Result(); err != nil || ttl <= 20*time.Second {
		t.Errorf("the key that stayed, on the migrating master: PTTL %v (%v), want it renewed past 20s", ttl, err)
	}
	pipe := dst.Client().Pipeline()
	pipe.Do(ctx, "ASKING")
	moved := pipe.PTTL(ctx, move)
	if _, err := pipe.Exec(ctx); err != nil || moved.Val() <= 20*time.Second {
		t.Errorf("the moved key, on the importing master: PTTL %v (%v), want it renewed past 20s", moved.Val(), err)
	}
}
