package wake

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/require"
)

// gatedNode is a flakyNode whose dials wait while hold is set, and which
// counts the SUBSCRIBE and UNSUBSCRIBE commands written to it.
type gatedNode struct {
	flakyNode
	hold          atomic.Pointer[chan struct{}]
	subs, unsubs  atomic.Int32
	heldDialsDone atomic.Int32
}

func (n *gatedNode) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if h := n.hold.Load(); h != nil {
		<-*h
		n.heldDialsDone.Add(1)
	}
	c, err := n.flakyNode.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return newCountingConn(c, n), nil
}

// countingConn counts what is written to it and forwards it from a
// goroutine of its own, as a socket's send buffer would: net.Pipe, which
// miniredis dials, blocks a write until the other end reads, and a
// subscription connection's other end (the node) blocks on its own
// replies while the hub's reader pauses.
type countingConn struct {
	net.Conn
	n *gatedNode

	mu     sync.Mutex
	closed bool
	out    chan []byte
}

func newCountingConn(c net.Conn, n *gatedNode) *countingConn {
	cc := &countingConn{Conn: c, n: n, out: make(chan []byte, 64)}
	go func() {
		for b := range cc.out {
			if _, err := c.Write(b); err != nil {
				return
			}
		}
	}()
	return cc
}

func (c *countingConn) Write(b []byte) (int, error) {
	l := bytes.ToLower(b)
	if bytes.Contains(l, []byte("unsubscribe")) {
		c.n.unsubs.Add(1)
	} else if bytes.Contains(l, []byte("subscribe")) {
		c.n.subs.Add(1)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	select {
	case c.out <- append([]byte(nil), b...):
		return len(b), nil
	default:
		return 0, errors.New("countingConn: send buffer full")
	}
}

func (c *countingConn) Close() error {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.out)
	}
	c.mu.Unlock()
	return c.Conn.Close()
}

// Close while the hub's writer is held in a dial leaves the writer both a
// kick (the waiters left) and a flush (stop now) when the dial returns. It
// takes the flush: the hub stops and closes its connection, which ends
// every subscription, without an UNSUBSCRIBE first. Which of the two it
// took was a random select's choice before, so the simulator's replays of
// one seed differed in that UNSUBSCRIBE.
//
// The order is forced in virtual time: the node crashes (the reader's
// reconnect is refused, and it pauses); dials are held; a new waiter makes
// the writer subscribe, which dials; Close comes while that dial is held;
// then the dial goes through.
func TestCloseDuringAHeldDialStopsWithoutUnsubscribing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		node := &gatedNode{flakyNode: flakyNode{m: miniredis.NewMiniRedis()}}
		defer node.m.Close()
		c := redis.NewClient(&redis.Options{
			Addr: "node", Dialer: node.dial, DisableIdentity: true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		defer func() { _ = c.Close() }()
		s := NewSet(c)
		const bound = time.Minute

		_, stopA, err := s.Watch(t.Context(), "redlease:wake:a", "", 1, bound)
		require.NoError(t, err)
		defer stopA(false)
		require.True(t, confirmed(c, "redlease:wake:a"), "first waiter confirmed: %s", hubState(c))

		node.crash()
		synctest.Wait() // the reader saw the break, its reconnect was refused; it pauses retryMin
		hold := make(chan struct{})
		node.hold.Store(&hold)
		node.up()

		watched := make(chan error, 1)
		go func() {
			_, stopB, err := s.Watch(t.Context(), "redlease:wake:b", "", 1, bound)
			if err == nil {
				stopB(false)
			}
			watched <- err
		}()
		synctest.Wait() // the writer's SUBSCRIBE dials, and the dial waits
		require.Zero(t, node.heldDialsDone.Load(), "no held dial went through yet")

		closed := make(chan struct{})
		go func() {
			s.Close(bound)
			close(closed)
		}()
		synctest.Wait() // Close kicked the writer (its waiters left) and flushed the hub
		subs, unsubs := node.subs.Load(), node.unsubs.Load()

		node.hold.Store(nil)
		released := time.Now()
		close(hold)
		<-closed // within Close's wait (a minute of virtual time)
		<-watched
		require.Equal(t, int32(1), node.heldDialsDone.Load(), "the writer's held dial went through")
		require.Greater(t, node.subs.Load(), subs, "the writer subscribed on the connection it dialled")
		require.Equal(t, unsubs, node.unsubs.Load(), "an UNSUBSCRIBE was sent after Close asked the hub to stop")
		require.Zero(t, time.Since(released), "Close returned when the held dial went through")
		require.Zero(t, Hubs(), "the hub stopped")
	})
}
