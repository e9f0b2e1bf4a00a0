package redlease_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/internal/wake"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// wakeSetup is one strategy on fresh redis-server processes, with clients
// as a newcomer writes them (go-redis defaults: no ContextTimeoutEnabled),
// and direct access to its servers.
type wakeSetup struct {
	name     string
	strategy redlease.Strategy
	servers  []*redistest.Server
	clients  []*redis.Client
}

// wakeSetups returns single (one node), failover (a primary with one
// replica) and quorum over three nodes, each closed when t ends.
func wakeSetups(t *testing.T) []func(t *testing.T) wakeSetup {
	mk := func(name string, n int) func(t *testing.T) wakeSetup {
		return func(t *testing.T) wakeSetup {
			t.Helper()
			ws := wakeSetup{name: name, servers: redistest.StartN(t, n, redistest.Config{})}
			var us []redis.UniversalClient
			for _, srv := range ws.servers {
				c := redis.NewClient(&redis.Options{Addr: srv.Addr})
				t.Cleanup(func() { _ = c.Close() })
				t.Cleanup(srv.Resume) // a test that paused it must not leave it so
				ws.clients = append(ws.clients, c)
				us = append(us, c)
			}
			switch name {
			case "single":
				s, err := single.New(us[0])
				require.NoError(t, err)
				ws.strategy = s
			case "failover":
				redistest.StartReplica(t, ws.servers[0], redistest.Config{})
				// Every grant needs the replica's acknowledgement: a WAIT
				// timeout only a hang misses (the default 100 ms is a window
				// a loaded machine missed).
				s, err := failover.New(us[0], failover.WithWaitTimeout(5*time.Second))
				require.NoError(t, err)
				ws.strategy = s
			default:
				q, err := quorum.New(us, quorum.WithNodeTimeout(quorumNodeTimeout))
				require.NoError(t, err)
				t.Cleanup(func() { _ = q.Close() })
				ws.strategy = q
			}
			if c, ok := ws.strategy.(interface{ Close() error }); ok {
				t.Cleanup(func() { _ = c.Close() })
			}
			return ws
		}
	}
	return []func(t *testing.T) wakeSetup{mk("single", 1), mk("failover", 1), mk("quorum", 3)}
}

// quorumNodeTimeout is the node timeout of wakeSetups' quorum.
const quorumNodeTimeout = 500 * time.Millisecond

// A holder that never releases (it crashed: its key expires, nothing is
// published) costs a waiter the holder's remaining TTL, not the backoff:
// the refusal carries the key's PTTL and the wait is cut to it. With a
// backoff of at least 5 s, the waiter gets the lock about 1 s (the
// holder's TTL) after the holder's grant. (The holder's TTL was 200 ms:
// a grant that took longer under load had no validity left and failed
// the test before it checked anything.)
func TestWaitIsBoundedByTheHoldersRemainingTTL(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	for _, setup := range wakeSetups(t) {
		ws := setup(t)
		t.Run(ws.name, func(t *testing.T) {
			ctx, key := t.Context(), "wake:ttl:"+ws.name
			holder, err := redlease.New(ws.strategy, redlease.WithTTL(time.Second))
			require.NoError(t, err)
			_, err = holder.TryLock(ctx, key) // never released
			require.NoError(t, err)
			start := time.Now()
			waiter, err := redlease.New(ws.strategy, redlease.WithTTL(time.Second), redlease.WithRetryDelay(5*time.Second, 10*time.Second))
			require.NoError(t, err)
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			lk, err := waiter.Lock(wctx, key)
			require.NoError(t, err)
			took := time.Since(start)
			require.NoError(t, lk.Release(ctx))
			// Unbounded, the first wait alone would be at least 2.5 s (half
			// the min delay, jittered) and usually 5 s.
			if ok, why := probe.Within(took, 2*time.Second, 3, start); !ok {
				require.Failf(t, "outside the window derived from this run", "the wait must end near the holder's expiry (1 s), not at the backoff (≥ 5 s): %s", why)
			}
		})
	}
}

// wakeLockIn runs waiter.Lock(key) on its own goroutine and returns a channel
// that delivers its outcome.
type wakeResult struct {
	lk  *redlease.Lock
	err error
	at  time.Time
}

func wakeLockIn(ctx context.Context, l *redlease.Locker, key string) <-chan wakeResult {
	out := make(chan wakeResult, 1)
	go func() {
		lk, err := l.Lock(ctx, key)
		out <- wakeResult{lk, err, time.Now()}
	}()
	return out
}

// wakeWait receives the outcome of wakeLockIn, failing the test after d
// plus 3 × what a probe measured this process stalled meanwhile.
func wakeWait(t *testing.T, res <-chan wakeResult, d time.Duration) wakeResult {
	t.Helper()
	probe := redistest.StartStallProbe(t)
	defer probe.Stop()
	return redistest.Await(t, probe, res, d, 3, "Lock did not return")
}

// A waiter subscribes, confirmed, before its second check, so a release
// between that check and its wait is not missed (Redisson's issue 1763).
// The schedule is forced with a gate: the waiter's SUBSCRIBE is held, and
// no second attempt may reach the server until it is let through and
// confirmed; then the reply to the second attempt (refused) is held while
// the holder releases; only then does the
// waiter see the refusal and start waiting. With a backoff of 10 s and a
// holder's TTL of 30 s, only the notice can end the wait within seconds.
func TestReleaseBetweenCheckAndWaitIsHeard(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	gate := redistest.NewGate(t, srv.Addr)
	direct := srv.Client()
	ctx := t.Context()
	require.NoError(t, script.Acquire.Load(ctx, direct)) // EVALSHA carries the hash the gate matches
	require.NoError(t, script.Release.Load(ctx, direct))
	viaGate := redis.NewClient(&redis.Options{Addr: gate.Addr})
	t.Cleanup(func() { _ = viaGate.Close() })
	ws, err := single.New(viaGate)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ws.Close() })
	hs, err := single.New(direct)
	require.NoError(t, err)

	key := "wake:race"
	locker, err := redlease.New(hs, redlease.WithTTL(30*time.Second))
	require.NoError(t, err)
	holder, err := locker.TryLock(ctx, key)
	require.NoError(t, err)

	gate.HoldReplies(script.Acquire.Hash())
	waiter, err := redlease.New(ws, redlease.WithTTL(time.Second), redlease.WithRetryDelay(10*time.Second, 10*time.Second))
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res := wakeLockIn(wctx, waiter, key)

	gate.HoldRequests("subscribe")
	require.NoError(t, gate.WaitHeld(1, "", 5*time.Second), "attempt 1's reply")
	require.NoError(t, gate.Step("", 5*time.Second))
	// Attempt 2 is sent only once the server confirmed the subscription:
	// while the SUBSCRIBE is held, no attempt reaches the server.
	require.NoError(t, gate.WaitHeld(1, "subscribe", 5*time.Second), "the waiter's SUBSCRIBE")
	time.Sleep(300 * time.Millisecond)
	require.Equal(t, 1, gate.Held(), "only the SUBSCRIBE is held: attempt 2 must wait for its confirmation")
	gate.HoldRequests("")
	require.NoError(t, gate.Step("subscribe", 5*time.Second))
	require.NoError(t, gate.WaitHeld(1, "", 5*time.Second), "attempt 2's reply")
	require.NoError(t, holder.Release(ctx)) // between attempt 2's check and its wait
	gate.HoldReplies("")
	start := time.Now()
	require.NoError(t, gate.Step("", 5*time.Second))
	r := wakeWait(t, res, 20*time.Second)
	require.NoError(t, r.err)
	took := r.at.Sub(start)
	if ok, why := probe.Within(took, 3*time.Second, 3, start); !ok {
		require.Failf(t, "outside the window derived from this run", "the release notice must end the wait; without it the wait is at least 5 s: %s", why)
	}
	require.True(t, strings.HasSuffix(r.lk.Token(), ".3"), "granted on attempt 3 (token %s): refused, subscribed and refused, woken", r.lk.Token())
	require.NoError(t, r.lk.Release(ctx))
}

// A release whose notice never comes — a holder that deletes the key
// without publishing (an older client, redsync, an ACL without PUBLISH),
// or a subscription connection cut while the release is published — costs
// the waiter at most the holder's TTL plus one backoff.
func TestLostNoticeCostsAtMostTheTTLPlusOneBackoff(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	const ttl, delay = 1500 * time.Millisecond, 300 * time.Millisecond
	for _, setup := range wakeSetups(t) {
		ws := setup(t)
		t.Run(ws.name+"/silent-delete", func(t *testing.T) {
			ctx, key := t.Context(), "wake:lost:"+ws.name
			locker, err := redlease.New(ws.strategy, redlease.WithTTL(ttl))
			require.NoError(t, err)
			holder, err := locker.TryLock(ctx, key)
			require.NoError(t, err)
			waiter, err := redlease.New(ws.strategy, redlease.WithTTL(time.Second), redlease.WithRetryDelay(delay, delay))
			require.NoError(t, err)
			res := wakeLockIn(ctx, waiter, key)
			time.Sleep(200 * time.Millisecond) // the waiter is waiting
			start := time.Now()
			for _, c := range ws.clients {
				require.NoError(t, c.Del(ctx, key).Err()) // released, nothing published
			}
			r := wakeWait(t, res, 10*time.Second)
			require.NoError(t, r.err)
			if ok, why := probe.Within(r.at.Sub(start), ttl+delay, 3, start); !ok {
				require.Failf(t, "outside the window derived from this run", "within the holder's TTL plus one backoff: %s", why)
			}
			_ = holder
			require.NoError(t, r.lk.Release(ctx))
		})
		t.Run(ws.name+"/subscription-cut", func(t *testing.T) {
			ctx, key := t.Context(), "wake:cut:"+ws.name
			locker2, err := redlease.New(ws.strategy, redlease.WithTTL(ttl))
			require.NoError(t, err)
			holder, err := locker2.TryLock(ctx, key)
			require.NoError(t, err)
			waiter, err := redlease.New(ws.strategy, redlease.WithTTL(time.Second), redlease.WithRetryDelay(delay, delay))
			require.NoError(t, err)
			res := wakeLockIn(ctx, waiter, key)
			time.Sleep(200 * time.Millisecond) // the waiter is subscribed and waiting
			// Cut every subscription connection, and release before
			// go-redis can have resubscribed: the publish finds nobody.
			pipes := make([]redis.Pipeliner, len(ws.clients))
			for i, c := range ws.clients {
				pipes[i] = c.Pipeline()
				pipes[i].Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub")
			}
			start := time.Now()
			for _, p := range pipes {
				_, err := p.Exec(ctx)
				require.NoError(t, err)
			}
			require.NoError(t, holder.Release(ctx))
			r := wakeWait(t, res, 10*time.Second)
			require.NoError(t, r.err)
			if ok, why := probe.Within(r.at.Sub(start), ttl+delay, 3, start); !ok {
				require.Failf(t, "outside the window derived from this run", "within the holder's TTL plus one backoff: %s", why)
			}
			require.NoError(t, r.lk.Release(ctx))
		})
	}
}

// Waiters hear a release within a fraction of their backoff: on single,
// and on quorum with one node paused (its notice cannot come; the others'
// do, and the acquisition still finds its majority).
func TestWaiterIsWokenByARelease(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	for _, setup := range wakeSetups(t) {
		ws := setup(t)
		run := func(name string, pause bool) {
			t.Run(ws.name+"/"+name, func(t *testing.T) {
				ctx, key := t.Context(), "wake:woken:"+ws.name+":"+name
				if pause {
					ws.servers[len(ws.servers)-1].Pause()
					defer ws.servers[len(ws.servers)-1].Resume()
				}
				locker, err := redlease.New(ws.strategy, redlease.WithTTL(30*time.Second))
				require.NoError(t, err)
				holder, err := locker.TryLock(ctx, key)
				require.NoError(t, err)
				waiter, err := redlease.New(ws.strategy, redlease.WithTTL(time.Second), redlease.WithRetryDelay(10*time.Second, 10*time.Second))
				require.NoError(t, err)
				res := wakeLockIn(ctx, waiter, key)
				time.Sleep(time.Second) // subscribed (a paused node's confirmation is waited for at most the node timeout) and waiting
				start := time.Now()
				require.NoError(t, holder.Release(ctx))
				r := wakeWait(t, res, 20*time.Second)
				require.NoError(t, r.err)
				if ok, why := probe.Within(r.at.Sub(start), 3*time.Second, 3, start); !ok {
					require.Failf(t, "outside the window derived from this run", "woken by the release, not the 5–10 s backoff: %s", why)
				}
				require.NoError(t, r.lk.Release(ctx))
			})
		}
		run("all-up", false)
		if ws.name == "quorum" {
			run("one-paused", true)
		}
	}
}

// pubsubConns counts the subscription connections open on c's server.
func pubsubConns(t *testing.T, c *redis.Client) int {
	t.Helper()
	list, err := c.ClientList(t.Context()).Result()
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if strings.Contains(line, " sub=") && !strings.Contains(line, " sub=0 ") {
			n++
		}
	}
	return n
}

// Many waiters, on one key and on many keys, share one subscription
// connection per node; one release wakes the waiters of its key only
// (the others stay waiting); once every waiter is gone, no subscription
// connection and no hub is left.
func TestWaitersShareOneConnectionPerNode(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	for _, setup := range wakeSetups(t) {
		ws := setup(t)
		t.Run(ws.name, func(t *testing.T) {
			ctx := t.Context()
			const keys, perKey = 8, 6
			hold, err := redlease.New(ws.strategy, redlease.WithTTL(30*time.Second))
			require.NoError(t, err)
			waiter, err := redlease.New(ws.strategy, redlease.WithTTL(30*time.Second), redlease.WithRetryDelay(10*time.Second, 10*time.Second))
			require.NoError(t, err)
			holders := make([]*redlease.Lock, keys)
			res := make([][]<-chan wakeResult, keys)
			for k := range keys {
				key := fmt.Sprintf("wake:many:%s:%d", ws.name, k)
				var err error
				holders[k], err = hold.TryLock(ctx, key)
				require.NoError(t, err)
				for range perKey {
					res[k] = append(res[k], wakeLockIn(ctx, waiter, key))
				}
			}
			// Every key's channel subscribed on every node (instead of a
			// sleep hoping for it): 10 s plus 3 × the measured stall.
			probe.WaitFor(t, 10*time.Second, 3, 10*time.Millisecond, func() bool {
				for _, c := range ws.clients {
					for k := range keys {
						channel := script.Channel(fmt.Sprintf("wake:many:%s:%d", ws.name, k))
						if n, err := c.PubSubNumSub(ctx, channel).Result(); err != nil || n[channel] == 0 {
							return false
						}
					}
				}
				return true
			}, "the waiters' channels never all subscribed")
			for i, c := range ws.clients {
				require.Equal(t, 1, pubsubConns(t, c), "node %d: one subscription connection for %d waiters on %d keys", i, keys*perKey, keys)
			}
			require.Equal(t, len(ws.clients), wake.Hubs(), "one hub per node")

			// Hand each key from waiter to waiter: every release wakes
			// the rest, one of them wins, and so on, each well within
			// the 5–10 s backoff.
			for k := range keys {
				start := time.Now()
				require.NoError(t, holders[k].Release(ctx))
				for range perKey {
					var got *redlease.Lock
					for got == nil {
						r := redistest.Await(t, probe, merge(res[k]), 4*time.Second, 3, "key %d: no waiter got the lock after the last release", k)
						require.NoError(t, r.err)
						got = r.lk
					}
					require.NoError(t, got.Release(ctx))
				}
				t.Logf("key %d: %d hand-offs in %v", k, perKey, time.Since(start).Round(time.Millisecond))
			}
			// Everyone left: the channels are unsubscribed and the hubs stop.
			probe.WaitFor(t, 5*time.Second, 3, 10*time.Millisecond, func() bool { return wake.Hubs() == 0 }, "no hub once no waiter is left")
			for i, c := range ws.clients {
				probe.WaitFor(t, 5*time.Second, 3, 10*time.Millisecond, func() bool { return pubsubConns(t, c) == 0 }, "node %d: subscription connection closed", i)
			}
		})
	}
}

// merge returns a channel that delivers the first value of any of cs;
// each c delivers once, and a c that delivered is left alone afterwards.
func merge(cs []<-chan wakeResult) <-chan wakeResult {
	out := make(chan wakeResult, len(cs))
	for _, c := range cs {
		select {
		case r := <-c:
			out <- r
			return out
		default:
		}
	}
	go func() {
		cases := make([]reflect.SelectCase, len(cs))
		for i, c := range cs {
			cases[i] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c)}
		}
		_, v, _ := reflect.Select(cases)
		out <- v.Interface().(wakeResult)
	}()
	return out
}

// A waiter whose ctx ends returns at its ctx (with the ctx's error, and
// ErrUnavailable: no node answered), also with the node paused and a
// default client; Close of the strategy while a waiter waits ends its
// subscription, stops the hubs, and the waiter keeps waiting by backoff
// until its ctx (refused, or on quorum, whose fanout Close stops,
// ErrUnavailable).
func TestWaiterReturnsAtItsContextAndOnClose(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	for _, setup := range wakeSetups(t) {
		ws := setup(t)
		t.Run(ws.name+"/ctx", func(t *testing.T) {
			ctx, key := t.Context(), "wake:ctx:"+ws.name
			locker, err := redlease.New(ws.strategy, redlease.WithTTL(30*time.Second))
			require.NoError(t, err)
			_, err = locker.TryLock(ctx, key)
			require.NoError(t, err)
			for _, srv := range ws.servers {
				srv.Pause() // every node: nothing answers, not even the subscription
			}
			wctx, cancel := context.WithTimeout(ctx, 700*time.Millisecond)
			defer cancel()
			start := time.Now()
			locker2, err := redlease.New(ws.strategy, redlease.WithTTL(time.Second))
			require.NoError(t, err)
			_, err = locker2.Lock(wctx, key)
			took := time.Since(start)
			for _, srv := range ws.servers {
				srv.Resume()
			}
			require.ErrorIs(t, err, redlease.ErrUnavailable)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			if ok, why := probe.Within(took, 700*time.Millisecond+500*time.Millisecond, 3, start); !ok {
				require.Failf(t, "outside the window derived from this run", "returns at its ctx, whatever the paused nodes and go-redis's 3 s read timeout: %s", why)
			}
		})
		t.Run(ws.name+"/close", func(t *testing.T) {
			ctx, key := t.Context(), "wake:close:"+ws.name
			locker3, err := redlease.New(ws.strategy, redlease.WithTTL(30*time.Second))
			require.NoError(t, err)
			_, err = locker3.TryLock(ctx, key)
			require.NoError(t, err)
			wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			locker4, err := redlease.New(ws.strategy, redlease.WithTTL(time.Second), redlease.WithRetryDelay(100*time.Millisecond, 100*time.Millisecond))
			require.NoError(t, err)
			res := wakeLockIn(wctx, locker4, key)
			time.Sleep(300 * time.Millisecond)
			require.Equal(t, len(ws.clients), wake.Hubs())
			start := time.Now()
			require.NoError(t, ws.strategy.(interface{ Close() error }).Close())
			if ok, why := probe.Within(time.Since(start), time.Second, 3, start); !ok {
				require.Failf(t, "outside the window derived from this run", "Close returns promptly: %s", why)
			}
			require.Equal(t, 0, wake.Hubs(), "Close waited for the hubs it left idle")
			r := wakeWait(t, res, 5*time.Second)
			if ws.name == "quorum" {
				// Its closed fanout reaches no node: the first attempt
				// after Close ends the wait, before the waiter's ctx.
				require.ErrorIs(t, r.err, redlease.ErrInvalid)
				require.NotErrorIs(t, r.err, context.DeadlineExceeded, "the wait ended at Close, not at its ctx")
				return
			}
			// Acquire still works after Close: refused, held.
			require.ErrorIs(t, r.err, redlease.ErrNotObtained)
			require.ErrorIs(t, r.err, context.DeadlineExceeded, "the waiter waited until its ctx")
		})
	}
}

// WithPolling: a waiter opens no subscription connection and is not woken
// by a release; its backoff (here 300 ms) hands the lock over.
func TestWithPollingDoesNotSubscribe(t *testing.T) {
	ws := wakeSetups(t)[0](t)
	ctx, key := t.Context(), "wake:polling"
	locker, err := redlease.New(ws.strategy, redlease.WithTTL(30*time.Second))
	require.NoError(t, err)
	holder, err := locker.TryLock(ctx, key)
	require.NoError(t, err)
	waiter, err := redlease.New(ws.strategy, redlease.WithTTL(time.Second), redlease.WithRetryDelay(300*time.Millisecond, 300*time.Millisecond), redlease.WithPolling())
	require.NoError(t, err)
	res := wakeLockIn(ctx, waiter, key)
	time.Sleep(200 * time.Millisecond)
	require.Equal(t, 0, pubsubConns(t, ws.clients[0]), "no subscription connection")
	require.NoError(t, holder.Release(ctx))
	r := wakeWait(t, res, 5*time.Second)
	require.NoError(t, r.err)
	require.NoError(t, r.lk.Release(ctx))
}
