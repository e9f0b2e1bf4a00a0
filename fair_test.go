package redlease_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/quorum"
)

// lineMembers returns the waiter ids in key's line on client, in order.
func lineMembers(t *testing.T, client *redis.Client, key string) []string {
	t.Helper()
	ids, err := client.ZRangeByScore(t.Context(), script.QueueKey(key), &redis.ZRangeBy{Min: "0", Max: "+inf"}).Result()
	require.NoError(t, err)
	return ids
}

// waitLine waits until key's line on every client has n waiters, the
// clients in turn, all within 10 s widened by 3 × the stall probe measured
// meanwhile (probe.WaitFor).
func waitLine(t *testing.T, probe *redistest.StallProbe, clients []*redis.Client, key string, n int) {
	t.Helper()
	i := 0 // clients[:i] have had n waiters
	probe.WaitFor(t, 10*time.Second, 3, 2*time.Millisecond, func() bool {
		for i < len(clients) && len(lineMembers(t, clients[i], key)) == n {
			i++
		}
		return i == len(clients)
	}, "line of %s never reached %d waiters: %s", key, n, redistest.Lazy(func() string {
		return fmt.Sprintf("client %d has %v", i, lineMembers(t, clients[i], key))
	}))
}

// fairMaxDelay is TestFairLockServesInArrivalOrder's longest retry delay.
const fairMaxDelay = 20 * time.Millisecond

// Waiters that arrive one after the other (each joined the line on every
// node before the next calls Lock) are served in that order, on every
// strategy, whatever order their retries and wake-ups come in. Each
// winner holds the key for a moment, so that the others' attempts (woken
// by the release, or by backoff) race it.
func TestFairLockServesInArrivalOrder(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	for _, setup := range wakeSetups(t) {
		ws := setup(t)
		t.Run(ws.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			key := "fair:order:" + ws.name
			locker, err := redlease.New(ws.strategy, redlease.WithFairness(true), redlease.WithTTL(5*time.Second), redlease.WithRetryDelay(time.Millisecond, fairMaxDelay))
			require.NoError(t, err)
			holder, err := locker.TryLock(ctx, key)
			require.NoError(t, err)
			const n = 6
			var (
				mu    sync.Mutex
				order []int
				wg    sync.WaitGroup
			)
			for i := range n {
				wg.Go(func() {
					lk, err := locker.Lock(ctx, key)
					if !assert.NoError(t, err, "waiter %d", i) {
						return
					}
					mu.Lock()
					order = append(order, i)
					mu.Unlock()
					time.Sleep(5 * time.Millisecond) // the others retry meanwhile
					assert.NoError(t, lk.Release(context.WithoutCancel(ctx)))
				})
				waitLine(t, probe, ws.clients[:1], key, i+1) // joined (the quorum: node 0; every node is asked at once)
				time.Sleep(2 * time.Millisecond)             // the next ticket is a later millisecond
			}
			require.NoError(t, holder.Release(ctx))
			wg.Wait()
			require.Equal(t, []int{0, 1, 2, 3, 4, 5}, order, "grants out of arrival order")
			if len(ws.clients) == 1 {
				// One node: each grant and release took the winner's entry
				// out before it returned.
				assert.Empty(t, lineMembers(t, ws.clients[0], key), "entries left behind")
				return
			}
			// A quorum's grant and release return at a majority: a node's
			// leave may still be on its way (within the node timeout), and
			// a join that lands after its Lock call ended stays until its
			// entry expires (LineLifetime after it landed: docs/fair-mode.md).
			// Beside yes > /dev/null x2 and a make test, a check made at
			// once found one entry left (1 of 30 runs).
			bound := quorumNodeTimeout + redlease.LineLifetime(fairMaxDelay)
			for i, c := range ws.clients {
				left, since := lineMembers(t, c, key), time.Now()
				probe.WaitFor(t, bound, 3, 5*time.Millisecond, func() bool { return len(lineMembers(t, c, key)) == 0 },
					"node %d: entries left behind past a join's lifetime (%v; in line when the last waiter returned: %v)", i, bound, left)
				if len(left) > 0 {
					t.Logf("node %d: %v in line when the last waiter returned, gone %v later", i, left, time.Since(since))
				}
			}
		})
	}
}

// A Lock that gives up (its ctx ends while the key is held) leaves the
// line on every node at once, rather than stalling the next waiter for
// its entry's lifetime; a TryLock never joins, and is refused with
// ErrQueued while a waiter is in line for a free key.
func TestFairLockThatGivesUpLeavesTheLineAndTryLockNeverJoins(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	for _, setup := range wakeSetups(t) {
		ws := setup(t)
		t.Run(ws.name, func(t *testing.T) {
			ctx := t.Context()
			key := "fair:leave:" + ws.name
			locker, err := redlease.New(ws.strategy, redlease.WithFairness(true), redlease.WithTTL(10*time.Second))
			require.NoError(t, err)
			holder, err := locker.TryLock(ctx, key)
			require.NoError(t, err)

			_, err = locker.TryLock(ctx, key)
			require.ErrorIs(t, err, redlease.ErrNotObtained)
			for _, c := range ws.clients {
				n, err := c.Exists(ctx, script.QueueKey(key)).Result()
				require.NoError(t, err)
				require.Zero(t, n, "a TryLock joined the line")
			}

			// Its entry lives LineLifetime(2 s) = 6 s: gone within 3 s
			// means it left. (The quorum's LeaveLine returns at a
			// majority; a straggler lands within the node timeout.)
			wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err = locker.Lock(wctx, key, redlease.WithRetryDelay(10*time.Millisecond, 2*time.Second))
			cancel()
			require.ErrorIs(t, err, redlease.ErrNotObtained)
			for i, c := range ws.clients {
				probe.WaitFor(t, 3*time.Second, 3, 5*time.Millisecond, func() bool {
					ids, err := c.ZRangeByScore(ctx, script.QueueKey(key), &redis.ZRangeBy{Min: "0", Max: "+inf"}).Result()
					return err == nil && len(ids) == 0
				}, "node %d: the Lock that gave up is still in line", i)
			}

			// A waiter in line (joined through the strategy: it never
			// comes back) and a free key: TryLock respects the line.
			q := ws.strategy.(redlease.Queuer)
			_, err = q.AcquireInLine(ctx, key, "W.1", 10*time.Second, redlease.Place{ID: "W", Ticket: time.Now(), Join: true, Lifetime: 10 * time.Second})
			require.ErrorIs(t, err, redlease.ErrNotObtained)
			require.NoError(t, holder.Release(ctx))
			_, err = locker.TryLock(ctx, key)
			require.ErrorIs(t, err, redlease.ErrQueued)
			require.ErrorIs(t, err, redlease.ErrNotObtained)
			// Without fairness the line is ignored.
			lk, err := locker.TryLock(ctx, key, redlease.WithFairness(false))
			require.NoError(t, err)
			require.NoError(t, lk.Release(ctx))
		})
	}
}

// A head that never comes back (a waiter that died or is paused between
// attempts) holds the key back for at most its entry's lifetime: a Lock
// behind it is refused until then, and granted soon after.
func TestFairDeadHeadIsSkippedAfterItsLifetime(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	for _, setup := range wakeSetups(t) {
		ws := setup(t)
		t.Run(ws.name, func(t *testing.T) {
			// A hang guard, not the bound (judged below by probe.Within):
			// the window there reaches a minute only after 18 s measured
			// stalled.
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			key := "fair:dead:" + ws.name
			locker, err := redlease.New(ws.strategy, redlease.WithFairness(true), redlease.WithTTL(10*time.Second))
			require.NoError(t, err)
			holder, err := locker.TryLock(ctx, key)
			require.NoError(t, err)
			const life = 600 * time.Millisecond
			q := ws.strategy.(redlease.Queuer)
			start := time.Now()
			// Its ticket is a second old: a ticket of the same millisecond
			// as the Lock's below would tie, and ties go by id (random).
			_, err = q.AcquireInLine(ctx, key, "Dead.1", 10*time.Second, redlease.Place{ID: "Dead", Ticket: time.Now().Add(-time.Second), Join: true, Lifetime: life})
			require.ErrorIs(t, err, redlease.ErrNotObtained)
			require.NoError(t, holder.Release(ctx))
			lk, err := locker.Lock(ctx, key)
			require.NoError(t, err)
			waited := time.Since(start)
			require.NoError(t, lk.Release(ctx))
			require.GreaterOrEqual(t, waited, life-10*time.Millisecond, "granted past a live head")
			// The bound: the lifetime, plus one backoff (≤ 320 ms) after
			// the expiry, plus 5 s slack, widened by 3 × the stall this
			// run measured since the dead head joined.
			if ok, why := probe.Within(waited, life+5*time.Second, 3, start); !ok {
				t.Fatalf("a dead head (lifetime %v) stalled the key past its lifetime: %s", life, why)
			}
			t.Logf("granted %v after the dead head joined (lifetime %v)", waited, life)
		})
	}
}

// Nodes of a quorum that have seen different waiters (joins lost, a node
// restarted without its line) still serve someone at once, and the
// oldest waiter converges to the head of every node it reaches: no
// livelock. Node lines are seeded as lost joins would leave them: A
// (oldest) only on nodes 0 and 1, B on nodes 2 to 4, and ghosts that never
// come back at the head of nodes 2 and 3.
func TestFairQuorumNodesWithDifferentLinesConverge(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	servers := redistest.StartN(t, 5, redistest.Config{})
	var (
		clients []*redis.Client
		us      []redis.UniversalClient
	)
	for _, srv := range servers {
		c := srv.Client()
		clients = append(clients, c)
		us = append(us, c)
	}
	q, err := quorum.New(us, quorum.WithNodeTimeout(time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	ctx := t.Context()
	var (
		key  string    // the try's key
		now  time.Time // when the try's lines were seeded
		a, b redlease.Place
	)
	seed := func(node int, p redlease.Place, life time.Duration) {
		deadline := now.Add(life).UnixMilli() // the servers share this machine's clock
		require.NoError(t, clients[node].ZAdd(ctx, script.QueueKey(key),
			redis.Z{Score: float64(p.Ticket.UnixMilli()), Member: p.ID},
			redis.Z{Score: -float64(deadline), Member: "@" + p.ID}).Err())
	}
	// The ghosts must outlive B's first attempt below: with 700 ms, at
	// load 15-30 (two make tests at once) they had expired by then, nodes
	// 2 to 4 had B at their head, and B was granted.
	const ghostLife = 4 * time.Second

	// B goes first: nodes 2 and 3 have the ghost at their head, node 4
	// grants, nodes 0 and 1 refuse (A is ahead): no majority, only a
	// fairness-preserving refusal. A goes next: it joins nodes 2 to 4 at
	// its ticket, ahead of B; nodes 0, 1 and 4 grant. (B's undo on node 4
	// may still be on its way when A's first attempt lands there — the
	// round decided on four refusals before node 4's reply, and undoes it
	// in the background — so A is granted within a few attempts, not
	// necessarily the first.)
	//
	// The precondition (B's first attempt comes while the ghosts live) is
	// the test's own work, a few calls: a try that took longer than the
	// ghosts' lifetime is made again on a fresh key, and a try in time
	// must come within ghostLife widened by 3 × the stall this run
	// measured meanwhile (probe.WaitFor).
	tries, took := 0, time.Duration(0)
	probe.WaitFor(t, ghostLife, 3, time.Millisecond, func() bool {
		tries++
		key = fmt.Sprintf("fair:converge:%d", tries)
		now = time.Now()
		a = redlease.Place{ID: "A", Ticket: now.Add(-3 * time.Second), Join: true, Lifetime: 5 * time.Second}
		b = redlease.Place{ID: "B", Ticket: now.Add(-2 * time.Second), Join: true, Lifetime: 5 * time.Second}
		for _, n := range []int{0, 1} {
			seed(n, a, 5*time.Second)
		}
		for _, n := range []int{2, 3, 4} {
			seed(n, b, 5*time.Second)
		}
		ghost := redlease.Place{ID: "Ghost", Ticket: now.Add(-4 * time.Second)}
		for _, n := range []int{2, 3} {
			seed(n, ghost, ghostLife)
		}
		_, err := q.AcquireInLine(ctx, key, "B.1", 10*time.Second, b)
		if took = time.Since(now); took >= ghostLife {
			t.Logf("try %d: B's first attempt came %v after the seeding, after the ghosts expired (%v): seeding again on a fresh key", tries, took.Round(time.Millisecond), ghostLife)
			return false
		}
		require.ErrorIs(t, err, redlease.ErrQueued)
		return true
	}, "B's first attempt never came while the ghosts lived (%v after the seeding): %s", ghostLife, redistest.Lazy(func() string {
		return fmt.Sprintf("%d tries, the last one's first attempt %v after its seeding", tries, took.Round(time.Millisecond))
	}))

	// A is served within 5 s, widened by 3 × the stall this run measured
	// meanwhile (probe.WaitFor); every refusal must be ErrNotObtained.
	var (
		token   string
		attempt int
		lastErr error
	)
	probe.WaitFor(t, 5*time.Second, 3, 5*time.Millisecond, func() bool {
		attempt++
		token = fmt.Sprintf("A.%d", attempt)
		g, err := q.AcquireInLine(ctx, key, token, 10*time.Second, a)
		if err == nil {
			require.True(t, g.Until.After(time.Now()))
			return true
		}
		require.ErrorIs(t, err, redlease.ErrNotObtained)
		lastErr = err
		return false
	}, "the oldest waiter not served although it is the head of a majority: %s", redistest.Lazy(func() string {
		return fmt.Sprintf("%d attempts, the last refused: %v", attempt, lastErr)
	}))
	t.Logf("A served at attempt %d", attempt)
	require.NoError(t, q.Release(ctx, key, token))
	// Release returns at a quorum; the other nodes' requests land within
	// the node timeout (1 s).
	for n, c := range clients {
		probe.WaitFor(t, 3*time.Second, 3, 5*time.Millisecond, func() bool {
			ids, err := c.ZRangeByScore(ctx, script.QueueKey(key), &redis.ZRangeBy{Min: "0", Max: "+inf"}).Result()
			return err == nil && !slices.Contains(ids, "A")
		}, "node %d: A's release left its entry", n)
	}

	// B is now the live head wherever the ghost has expired; within the
	// ghost's lifetime plus a bounded number of attempts B is served:
	// within 10 s of the ghosts' expiry (or of this wait's start, if they
	// had expired by then: B tries only from here), widened by 3 × the
	// stall this run measured meanwhile (probe.WaitFor).
	attempt, lastErr = 1, nil
	probe.WaitFor(t, max(time.Until(now.Add(ghostLife)), 0)+10*time.Second, 3, 5*time.Millisecond, func() bool {
		attempt++
		_, err := q.AcquireInLine(ctx, key, fmt.Sprintf("B.%d", attempt), 10*time.Second, b)
		if err == nil {
			return true
		}
		require.ErrorIs(t, err, redlease.ErrNotObtained)
		lastErr = err
		return false
	}, "B not served 10 s after the ghosts expired: %s", redistest.Lazy(func() string {
		return fmt.Sprintf("attempt %d refused: %v", attempt, lastErr)
	}))
}
