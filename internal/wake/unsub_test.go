package wake

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
	"github.com/stretchr/testify/require"
)

// flakyNode is a miniredis node inside a synctest bubble whose dials the
// test refuses at will, and whose open connections it can cut.
type flakyNode struct {
	m *miniredis.Miniredis

	mu    sync.Mutex
	down  bool
	dials int
	conns []net.Conn
}

func (n *flakyNode) dial(context.Context, string, string) (net.Conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.dials++
	if n.down {
		return nil, errors.New("connection refused (test)")
	}
	c, err := n.m.Dial()
	if err == nil {
		n.conns = append(n.conns, c)
	}
	return c, err
}

// crash cuts every connection and refuses dials until up.
func (n *flakyNode) crash() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.down = true
	for _, c := range n.conns {
		_ = c.Close()
	}
	n.conns = nil
}

func (n *flakyNode) up() {
	n.mu.Lock()
	n.down = false
	n.mu.Unlock()
}

func (n *flakyNode) dialCount() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.dials
}

// confirmed reports whether the hub of c has channel confirmed.
func confirmed(c redis.UniversalClient, channel string) bool {
	mu.Lock()
	defer mu.Unlock()
	h := hubs[registryKey(c)]
	if h == nil {
		return false
	}
	e := h.chans[channel]
	return e != nil && e.confirmed
}

// An UNSUBSCRIBE that cannot be sent — the last waiter of a channel left
// while the node was unreachable — gets no reply, ever. If the hub still
// counted it as on its way, it would take the next waiter's "subscribe"
// confirmation for that channel as an old one and drop it: that waiter's
// Watch would wait for its whole bound, and so would every later one on
// that channel until the connection broke again.
//
// The order is forced in virtual time: the node crashes (the reader's
// read fails, its reconnect is refused, it pauses); the waiter leaves and
// the writer's UNSUBSCRIBE finds no connection (its dial is refused); the
// node comes back and the reader reconnects without error (nothing to
// resubscribe but a waiter's channel on another key, which keeps the hub).
// Then a new waiter watches the same channel.
func TestUnsubscribeThatCouldNotBeSentDoesNotHideTheNextConfirmation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		node := &flakyNode{m: miniredis.NewMiniRedis()}
		defer node.m.Close()
		c := redis.NewClient(&redis.Options{
			Addr: "node", Dialer: node.dial, DisableIdentity: true,
			MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		})
		defer func() { _ = c.Close() }()
		s := NewSet(c)
		defer s.Close(time.Second)
		const ch, bound = "redlease:wake:k", time.Minute

		// A waiter on another key keeps the hub (and its count) alive
		// throughout, as on a busy process.
		_, stopOther, err := s.Watch(t.Context(), "redlease:wake:other", "", 1, bound)
		require.NoError(t, err)
		defer stopOther(false)
		_, stop, err := s.Watch(t.Context(), ch, "", 1, bound)
		require.NoError(t, err)
		require.True(t, confirmed(c, ch), "first waiter confirmed: %s", hubState(c))

		node.crash()
		synctest.Wait() // the reader saw the break, its reconnect was refused; it pauses
		require.False(t, confirmed(c, ch), "the break unconfirms: %s", hubState(c))

		dials := node.dialCount()
		stop(false) // the last waiter leaves: the writer's UNSUBSCRIBE has no connection
		synctest.Wait()
		require.Greater(t, node.dialCount(), dials, "the writer tried to send the UNSUBSCRIBE (and its dial was refused)")

		node.up()
		time.Sleep(retryMax) // the reader's pause ends; it reconnects, with nothing to resubscribe
		synctest.Wait()

		start := time.Now()
		_, stop2, err := s.Watch(t.Context(), ch, "", 1, bound)
		require.NoError(t, err)
		defer stop2(false)
		took := time.Since(start)
		require.True(t, confirmed(c, ch), "the new waiter's SUBSCRIBE was confirmed by the node, and the hub must count it: %s", hubState(c))
		require.Less(t, took, time.Second, "Watch returned at its bound (%v), not at the confirmation", bound)
	})
}
