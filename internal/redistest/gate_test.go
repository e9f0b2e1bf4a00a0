package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The gate applies held requests in the order the test steps them, not in
// the order the clients sent them, and keeps a reply back until released.
func TestGateOrdersHeldRequests(t *testing.T) {
	srv := Start(t, Config{})
	g := NewGate(t, srv.Addr)
	ctx := context.Background()
	a := redis.NewClient(&redis.Options{Addr: g.Addr})
	b := redis.NewClient(&redis.Options{Addr: g.Addr})
	defer func() { _ = a.Close(); _ = b.Close() }()
	require.NoError(t, a.Ping(ctx).Err())
	require.NoError(t, b.Ping(ctx).Err())

	g.HoldRequests("gated")
	first := make(chan error, 1)
	go func() { first <- a.Set(ctx, "gated", "first", 0).Err() }()
	require.NoError(t, g.WaitHeld(1, "first", 5*time.Second))
	second := make(chan error, 1)
	go func() { second <- b.Set(ctx, "gated", "second", 0).Err() }()
	require.NoError(t, g.WaitHeld(1, "second", 5*time.Second))
	require.Equal(t, int64(0), srv.Client().Exists(ctx, "gated").Val(), "held requests must not reach the server")

	// Apply the second one first, then the first.
	require.NoError(t, g.Step("second", 5*time.Second))
	require.NoError(t, <-second)
	require.Equal(t, "second", srv.Client().Get(ctx, "gated").Val())
	require.NoError(t, g.Step("", 5*time.Second))
	require.NoError(t, <-first)
	require.Equal(t, "first", srv.Client().Get(ctx, "gated").Val())

	// A held reply: the command is applied, the client does not know yet.
	g.HoldRequests("")
	g.HoldReplies("reply-me")
	done := make(chan error, 1)
	go func() { done <- a.Set(ctx, "reply-me", "1", 0).Err() }()
	require.NoError(t, g.WaitHeld(1, "", 5*time.Second))
	require.Equal(t, "1", srv.Client().Get(ctx, "reply-me").Val())
	select {
	case err := <-done:
		t.Fatalf("reply arrived while held: %v", err)
	default:
	}
	g.Open()
	require.NoError(t, <-done)
}

// DropReplies swallows a published message on its way to a subscriber
// through the gate; the subscription connection stays open, and the next
// message, once the drop is lifted, arrives.
func TestGateDropsPublishedMessages(t *testing.T) {
	probe := StartStallProbe(t)
	srv := Start(t, Config{})
	g := NewGate(t, srv.Addr)
	ctx := t.Context()
	sub := redis.NewClient(&redis.Options{Addr: g.Addr})
	defer func() { _ = sub.Close() }()
	ps := sub.Subscribe(ctx, "ch")
	defer func() { _ = ps.Close() }()
	_, err := ps.ReceiveTimeout(ctx, 5*time.Second) // the confirmation
	require.NoError(t, err)
	pub := srv.Client()

	g.DropReplies("swallow-me")
	require.Equal(t, int64(1), pub.Publish(ctx, "ch", "swallow-me").Val(), "the server sent it to its one subscriber")
	probe.WaitFor(t, 5*time.Second, 3, time.Millisecond, func() bool { return g.Dropped() == 1 }, "the gate never dropped the published message")
	g.DropReplies("")
	require.Equal(t, int64(1), pub.Publish(ctx, "ch", "keep-me").Val())
	msg, err := ps.ReceiveTimeout(ctx, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "keep-me", msg.(*redis.Message).Payload, "the dropped message never arrives, the next one does, on the same connection")
	require.Equal(t, 1, g.Dropped())
}

// rawConn is one connection through a gate that speaks RESP by hand, so a
// test sees exactly what arrives: a reply, a timeout, or the end.
type rawConn struct {
	c net.Conn
	r *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{c: c, r: bufio.NewReader(c)}
}

// send writes one command in the inline form.
func (rc *rawConn) send(t *testing.T, cmd string) {
	t.Helper()
	_, err := rc.c.Write([]byte(cmd + "\r\n"))
	require.NoError(t, err)
}

// reply reads one reply line, waiting at most d.
func (rc *rawConn) reply(d time.Duration) (string, error) {
	_ = rc.c.SetReadDeadline(time.Now().Add(d))
	line, err := rc.r.ReadString('\n')
	return strings.TrimSpace(line), err
}

// Cut ends every connection and refuses new ones, and keeps the port:
// nobody can listen there while the gate is cut (the toxiproxy-based proxy
// gave its port up on Cut, and its Heal once failed with "bind: address
// already in use"), and after Heal clients connect again.
func TestGateCutKeepsItsPort(t *testing.T) {
	srv := Start(t, Config{})
	g := NewGate(t, srv.Addr)
	for round := range 3 {
		open := dialRaw(t, g.Addr)
		open.send(t, "PING")
		got, err := open.reply(5 * time.Second)
		require.NoError(t, err, "round %d", round)
		require.Equal(t, "+PONG", got)

		g.Cut()
		_, err = open.reply(5 * time.Second)
		require.Error(t, err, "round %d: an open connection ends on Cut", round)
		require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "round %d: ended, not silent: %v", round, err)
		c, err := net.DialTimeout("tcp", g.Addr, 5*time.Second)
		if err == nil {
			_ = c.Close()
		}
		if runtime.GOOS == "linux" {
			require.ErrorIs(t, err, syscall.ECONNREFUSED, "round %d: a new connection is refused while cut", round)
		}
		ln, err := net.Listen("tcp", g.Addr)
		if err == nil {
			_ = ln.Close()
		}
		require.Error(t, err, "round %d: the gate's port must stay taken while it is cut", round)

		g.Heal()
		again := dialRaw(t, g.Addr)
		again.send(t, "PING")
		got, err = again.reply(5 * time.Second)
		require.NoError(t, err, "round %d: after Heal", round)
		require.Equal(t, "+PONG", got)
	}
}

// BlackHole lets nothing through and keeps connections open, old and new;
// after Heal what waited arrives, in order.
func TestGateBlackHoleHoldsAndHeals(t *testing.T) {
	srv := Start(t, Config{})
	g := NewGate(t, srv.Addr)
	ctx := t.Context()
	old := dialRaw(t, g.Addr)
	old.send(t, "PING")
	got, err := old.reply(5 * time.Second)
	require.NoError(t, err)
	require.Equal(t, "+PONG", got)

	g.BlackHole()
	old.send(t, "SET bh-old 1")
	fresh := dialRaw(t, g.Addr) // accepted: the gate still listens
	fresh.send(t, "SET bh-new 1")
	for _, rc := range []*rawConn{old, fresh} {
		_, err := rc.reply(200 * time.Millisecond)
		require.ErrorIs(t, err, os.ErrDeadlineExceeded, "silence, not an answer or an end")
	}
	require.Zero(t, srv.Client().Exists(ctx, "bh-old", "bh-new").Val(), "nothing reached the server")

	g.Heal()
	for _, rc := range []*rawConn{old, fresh} {
		got, err := rc.reply(5 * time.Second)
		require.NoError(t, err)
		require.Equal(t, "+OK", got, "the write held in the hole arrives after Heal")
	}
	require.Equal(t, int64(2), srv.Client().Exists(ctx, "bh-old", "bh-new").Val())
}

// Delay holds each reply back at least as long as asked.
func TestGateDelaysReplies(t *testing.T) {
	srv := Start(t, Config{})
	g := NewGate(t, srv.Addr)
	ctx := t.Context()
	c := g.Client()
	require.NoError(t, c.Ping(ctx).Err()) // a pooled connection: no dial below
	const d = 30 * time.Millisecond
	g.Delay(d)
	for range 3 {
		start := time.Now()
		require.NoError(t, c.Ping(ctx).Err())
		require.GreaterOrEqual(t, time.Since(start), d)
	}
	g.Heal()
	require.NoError(t, c.Ping(ctx).Err())
}

// WaitHeld fails once its window has passed with nothing held, and says
// how the window was derived (d plus a multiple of the measured stall).
func TestGateWaitHeldDerivesItsWindow(t *testing.T) {
	srv := Start(t, Config{})
	g := NewGate(t, srv.Addr)
	start := time.Now()
	err := g.WaitHeld(1, "", 30*time.Millisecond)
	require.Error(t, err)
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "waited its bound")
	require.Contains(t, err.Error(), "measured stalled", "the error says how the window was derived")
}

// Open lets go every reply, also one whose request went through while a
// reply match held it and whose reply comes only after Open: Open ends
// holding, it does not only empty the queue. Forced order: a BLPOP goes
// through while its reply is to be held, the server blocks it, Open, and
// only then does an LPUSH (on another connection) make the server answer.
func TestGateOpenLetsGoARepliesStillOnTheirWay(t *testing.T) {
	probe := StartStallProbe(t)
	srv := Start(t, Config{})
	g := NewGate(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: g.Addr, ReadTimeout: -1}) // BLPOP 0 waits as long as it takes
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	require.NoError(t, c.Ping(ctx).Err())

	const key = "open-while-on-its-way"
	g.HoldReplies(key)
	done := make(chan error, 1)
	go func() { done <- c.BLPop(context.Background(), 0, key).Err() }()
	direct := srv.Client()
	probe.WaitFor(t, 5*time.Second, 3, time.Millisecond, func() bool {
		info, err := direct.Info(ctx, "clients").Result()
		return err == nil && strings.Contains(info, "blocked_clients:1\r\n")
	}, "the server never blocked the BLPOP sent through the gate")
	require.Equal(t, 0, g.Held(), "nothing to hold yet: the server has not answered")
	g.Open()
	require.NoError(t, direct.LPush(ctx, key, "v").Err())
	require.NoError(t, Await(t, probe, done, 5*time.Second, 3,
		"the reply to a request that went through before Open was held after Open (%s held)", Lazy(func() string { return fmt.Sprint(g.Held()) })))
}
