package failover_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/contract"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
)

// scriptedSentinel stands in for a Sentinel: it answers SENTINEL MASTER and
// SENTINEL GET-MASTER-ADDR-BY-NAME for one master with the configuration
// the test set (set), takes subscriptions to +switch-master and publishes
// on them only what the test says (publish). So the test decides what
// every look at the Sentinels sees, and what else the Watcher hears.
type scriptedSentinel struct {
	addr   string
	master string

	mu     sync.Mutex
	epoch  int64
	host   string
	port   string
	served map[int64]int // answers that completed a look, by the epoch that look saw
	subs   map[*server.Peer]bool
}

// sentinelPeer is a connection's state, kept by its own goroutine: the
// epoch its last SENTINEL MASTER answer carried.
type sentinelPeer struct {
	epoch int64
}

func startScriptedSentinel(t *testing.T, master, primary string, epoch int64) *scriptedSentinel {
	t.Helper()
	srv, err := server.NewServer("127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(srv.Close)
	ss := &scriptedSentinel{addr: srv.Addr().String(), master: master, served: map[int64]int{}, subs: map[*server.Peer]bool{}}
	ss.set(epoch, primary)
	peer := func(c *server.Peer) *sentinelPeer {
		if p, ok := c.Ctx.(*sentinelPeer); ok {
			return p
		}
		p := &sentinelPeer{}
		c.Ctx = p
		return p
	}
	require.NoError(t, srv.Register("SENTINEL", func(c *server.Peer, _ string, args []string) {
		if len(args) != 2 || args[1] != ss.master {
			c.WriteError("ERR unexpected SENTINEL call")
			return
		}
		ss.mu.Lock()
		defer ss.mu.Unlock()
		switch strings.ToUpper(args[0]) {
		case "MASTER":
			peer(c).epoch = ss.epoch
			c.WriteStrings([]string{"name", ss.master, "ip", ss.host, "port", ss.port,
				"flags", "master", "config-epoch", strconv.FormatInt(ss.epoch, 10)})
		case "GET-MASTER-ADDR-BY-NAME":
			ss.served[peer(c).epoch]++
			c.WriteStrings([]string{ss.host, ss.port})
		default:
			c.WriteError("ERR unexpected SENTINEL call")
		}
	}))
	require.NoError(t, srv.Register("SUBSCRIBE", func(c *server.Peer, _ string, args []string) {
		ss.mu.Lock()
		if !ss.subs[c] {
			c.OnDisconnect(func() {
				ss.mu.Lock()
				delete(ss.subs, c)
				ss.mu.Unlock()
			})
		}
		ss.subs[c] = true
		ss.mu.Unlock()
		c.Block(func(w *server.Writer) {
			for i, ch := range args {
				w.WriteLen(3)
				w.WriteBulk("subscribe")
				w.WriteBulk(ch)
				w.WriteInt(i + 1)
			}
		})
	}))
	require.NoError(t, srv.Register("PING", func(c *server.Peer, _ string, _ []string) {
		ss.mu.Lock()
		subscribed := ss.subs[c]
		ss.mu.Unlock()
		if subscribed {
			c.WriteStrings([]string{"pong", ""})
			return
		}
		c.WriteInline("PONG")
	}))
	return ss
}

// publish sends a +switch-master message for a move from one address to
// another to every subscribed connection, and returns how many it reached.
func (ss *scriptedSentinel) publish(from, to string) int {
	fh, fp, err := net.SplitHostPort(from)
	if err != nil {
		panic(err)
	}
	th, tp, err := net.SplitHostPort(to)
	if err != nil {
		panic(err)
	}
	payload := strings.Join([]string{ss.master, fh, fp, th, tp}, " ")
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for c := range ss.subs {
		c.Block(func(w *server.Writer) {
			w.WriteLen(3)
			w.WriteBulk("message")
			w.WriteBulk("+switch-master")
			w.WriteBulk(payload)
			w.Flush()
		})
	}
	return len(ss.subs)
}

// subscribers returns how many connections are subscribed.
func (ss *scriptedSentinel) subscribers() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.subs)
}

// set makes every later look see the primary at addr, named by a
// configuration of config epoch epoch.
func (ss *scriptedSentinel) set(epoch int64, addr string) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		panic(err)
	}
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.epoch, ss.host, ss.port = epoch, host, port
}

// looks returns how many looks at this Sentinel saw config epoch epoch.
func (ss *scriptedSentinel) looks(epoch int64) int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return ss.served[epoch]
}

// watched is a primary A with a replica (grants need its WAIT), the
// failover strategy on A, a locker on it, and a scripted Sentinel that
// names A under config epoch 1. A plays every primary: the Watcher knows
// primaries only by the addresses the Sentinel names.
type watched struct {
	a      *redistest.Server
	other  string // an address the Sentinel can name as another primary
	s      *failover.Strategy
	locker *redlease.Locker
	sent   *scriptedSentinel
	sc     *redis.SentinelClient
}

func startWatched(t *testing.T) *watched {
	t.Helper()
	a := redistest.Start(t, redistest.Config{})
	replica := redistest.StartReplica(t, a, redistest.Config{})
	s, err := failover.New(a.Client())
	require.NoError(t, err)
	locker, err := redlease.New(s, redlease.WithTTL(time.Minute))
	require.NoError(t, err)
	sent := startScriptedSentinel(t, master, a.Addr, 1)
	sc := redis.NewSentinelClient(&redis.Options{Addr: sent.addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = sc.Close() })
	return &watched{a: a, other: replica.Addr, s: s, locker: locker, sent: sent, sc: sc}
}

// watch starts a Watcher on the scripted Sentinel, closed on cleanup.
func (wd *watched) watch(t *testing.T, poll time.Duration) *failover.Watcher {
	t.Helper()
	w, err := failover.NewWatcher(t.Context(), wd.s, master, poll, wd.sc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	require.Equal(t, wd.a.Addr, w.Primary())
	return w
}

// lock takes key, which must be free.
func (wd *watched) lock(t *testing.T, key string) *redlease.Lock {
	t.Helper()
	lk, err := wd.locker.TryLock(t.Context(), key)
	require.NoError(t, err)
	t.Cleanup(func() { _ = lk.Release(context.Background()) })
	return lk
}

// loseKey deletes key on A and sets its fence counter back to below
// fence, the lost holder's, as a failover to a replica that received
// neither the key nor the increment of its grant does (A, a replica in
// between, took that replica's data). (A counter lost outright would not
// do: one created anew starts from the server's clock, above the lost
// holder's fence.)
func (wd *watched) loseKey(t *testing.T, key string, fence uint64) {
	t.Helper()
	fk, ok := script.FenceKey(key)
	require.True(t, ok)
	require.NoError(t, wd.a.Client().Del(t.Context(), key).Err())
	require.NoError(t, wd.a.Client().Set(t.Context(), fk, fence-1, redis.KeepTTL).Err())
}

// revokedWithin fails the test unless lk's Lost closes within bound plus
// 3 × what a probe measured this process stalled meanwhile
// (redistest.Await), saying what state says then.
func revokedWithin(t *testing.T, lk *redlease.Lock, bound time.Duration, state func() string) {
	t.Helper()
	probe := redistest.StartStallProbe(t)
	defer probe.Stop()
	redistest.Await(t, probe, lk.Lost(), bound, 3, "not revoked: %s", redistest.Lazy(state))
	assert.ErrorIs(t, lk.Err(), failover.ErrFailover)
}

// Sentinel fails over from A to B and back to A between two looks of the
// Watcher, which hears no +switch-master (lost with a connection, say).
// Both looks name A; only the config epoch tells, risen from 1 to 3. B
// never had holder 1's key nor its fence counter's last increment, and A,
// a replica of B in between, lost them too: holder 2 is granted with a fence no higher than
// holder 1's, while holder 1 still believes itself the holder. The first
// look that sees the risen epoch must revoke holder 1.
//
// The order is forced by a scripted Sentinel: every look sees epoch 1 until
// holder 2 holds the key, and epoch 3 from then on.
func TestWatchRevokesOnAFailoverAndFailbackBetweenTwoLooks(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	wd := startWatched(t)
	w := wd.watch(t, 100*time.Millisecond)
	key := contract.Key(t)
	h1 := wd.lock(t, key)

	wd.loseKey(t, key, h1.Fence())
	h2 := wd.lock(t, key)
	require.LessOrEqual(t, h2.Fence(), h1.Fence(), "the fence counter was lost with the key: fences do not rise")
	require.True(t, h1.Valid(), "no look has told of the failover yet")
	require.Zero(t, w.Revoked())
	require.Zero(t, wd.sent.looks(3))

	// The Sentinel now names A under config epoch 3.
	wd.sent.set(3, wd.a.Addr)
	revokedWithin(t, h1, 10*time.Second, func() string {
		return fmt.Sprintf("holder 1 (fence %d, valid %v) after the Sentinel named A under config epoch 3 (seen by %d looks), while holder 2 (fence %d, valid %v) holds the key; revoked %d",
			h1.Fence(), h1.Valid(), wd.sent.looks(3), h2.Fence(), h2.Valid(), w.Revoked())
	})
	assert.Positive(t, wd.sent.looks(3), "revoked by a look that saw config epoch 3")
	probe.WaitFor(t, time.Second, 3, time.Millisecond, func() bool { return w.Revoked() == 2 }, "both holders revoked: revoked %d", w.Revoked())
	assert.Equal(t, wd.a.Addr, w.Primary())
}

// A +switch-master from A to B revokes holder 1 at once; the looks that
// follow still see the configuration it replaced (epoch 1, A: the
// Sentinels answering lag). Holder 2 takes a key on B. Then B fails over
// to C and back between two looks, losing holder 2's key and its fence
// counter's last increment, and holder 3 takes it. The look that finally sees B under
// config epoch 4 confirms the message's failover and must not hide the
// second one: it revokes holder 2 (and holder 3, the cost of a rule that
// cannot tell the two apart).
//
// The order is forced by a scripted Sentinel, as above.
func TestWatchRevokesOnAFailoverHiddenBehindASwitchMessage(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	wd := startWatched(t)
	w := wd.watch(t, 100*time.Millisecond)
	probe.WaitFor(t, 10*time.Second, 3, 5*time.Millisecond, func() bool { return wd.sent.subscribers() > 0 }, "the Watcher never subscribed to +switch-master")
	h1 := wd.lock(t, contract.Key(t))
	require.Equal(t, 1, wd.sent.publish(wd.a.Addr, wd.other))
	revokedWithin(t, h1, 10*time.Second, func() string { return "holder 1 after a +switch-master" })
	require.Equal(t, wd.other, w.Primary())

	key := contract.Key(t)
	h2 := wd.lock(t, key)
	wd.loseKey(t, key, h2.Fence())
	h3 := wd.lock(t, key)
	require.LessOrEqual(t, h3.Fence(), h2.Fence(), "the fence counter was lost with the key: fences do not rise")
	require.True(t, h2.Valid(), "no look has told of the second failover yet")
	require.Positive(t, wd.sent.looks(1), "looks after the message saw epoch 1")

	wd.sent.set(4, wd.other)
	revokedWithin(t, h2, 10*time.Second, func() string {
		return fmt.Sprintf("holder 2 (fence %d, valid %v) after the Sentinel named B under config epoch 4 (seen by %d looks), while holder 3 (fence %d, valid %v) holds the key; revoked %d",
			h2.Fence(), h2.Valid(), wd.sent.looks(4), h3.Fence(), h3.Valid(), w.Revoked())
	})
	assert.Positive(t, wd.sent.looks(4), "revoked by a look that saw config epoch 4")
	probe.WaitFor(t, time.Second, 3, time.Millisecond, func() bool { return w.Revoked() == 3 }, "all three holders revoked: revoked %d", w.Revoked())
}

// A +switch-master has the Sentinels asked at once, so the look that
// confirms it comes within a round trip, not at the next poll (an hour
// away here).
func TestWatchAsksAtOnceAfterASwitchMessage(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	wd := startWatched(t)
	w := wd.watch(t, time.Hour)
	probe.WaitFor(t, 10*time.Second, 3, 5*time.Millisecond, func() bool { return wd.sent.subscribers() > 0 }, "the Watcher never subscribed to +switch-master")
	wd.sent.set(2, wd.other)
	require.Equal(t, 1, wd.sent.publish(wd.a.Addr, wd.other))
	probe.WaitFor(t, 10*time.Second, 3, time.Millisecond, func() bool { return wd.sent.looks(2) > 0 }, "no look at the Sentinel within 10 s of a +switch-master")
	assert.Equal(t, wd.other, w.Primary())
}

// Locks the strategy holds when NewWatcher first asks the Sentinels are
// revoked: the epoch NewWatcher adopts counts any failover they lived through.
// Locks taken after stay.
func TestWatchRevokesLocksHeldBeforeItStarts(t *testing.T) {
	wd := startWatched(t)
	before := wd.lock(t, contract.Key(t))
	w := wd.watch(t, time.Hour)
	revokedWithin(t, before, 10*time.Second, func() string {
		return fmt.Sprintf("a lock held before NewWatcher (valid %v); revoked %d", before.Valid(), w.Revoked())
	})
	assert.Equal(t, 1, w.Revoked())
	after := wd.lock(t, contract.Key(t))
	assert.True(t, after.Valid())
	assert.Equal(t, 1, w.Revoked())
}
