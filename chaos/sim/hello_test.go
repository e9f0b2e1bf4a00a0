package sim

import (
	"bufio"
	"bytes"
	"testing"
	"testing/synctest"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/stretchr/testify/require"
)

// TestHello2Reply: a node answers HELLO 2 (the handshake of every go-redis
// connection) with the bytes a miniredis answers it with, leaving the
// connection on RESP2, and leaves every other HELLO (3, with options,
// malformed) to miniredis, which answers it as without the node's hook.
func TestHello2Reply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, end := handWorld(t, 1, Scenario{Name: "hand", Strategy: Single, Nodes: 1, Clients: 1, Keys: 1}, false)
		defer end()
		n := w.nodes[0]
		ref := miniredis.NewMiniRedis()
		defer ref.Close()
		if c, err := ref.Dial(); err == nil {
			_ = c.Close()
		}
		answer := func(dispatch func(*server.Peer, []string), p *server.Peer, buf *bytes.Buffer, w *bufio.Writer, args ...string) string {
			buf.Reset()
			dispatch(p, args)
			require.NoError(t, w.Flush())
			return buf.String()
		}
		var nbuf, rbuf bytes.Buffer
		nw, rw := bufio.NewWriter(&nbuf), bufio.NewWriter(&rbuf)
		np, rp := server.NewPeer(nw), server.NewPeer(rw)
		viaNode := func(p *server.Peer, args []string) {
			n.mu.Lock()
			defer n.mu.Unlock()
			n.m.Server().Dispatch(p, args)
		}
		for _, args := range [][]string{
			{"HELLO", "2"}, {"HELLO", "3"}, {"HELLO", "2"}, {"HELLO", "3", "SETNAME", "x"}, {"HELLO", "2"},
			{"HELLO", "2", "SETNAME", "x"}, {"HELLO"}, {"HELLO", "4"}, {"HELLO", "x"}, {"HELLO", "3"}, {"PING"}, {"HELLO", "2"}, {"PING"},
		} {
			got := answer(viaNode, np, &nbuf, nw, args...)
			want := answer(ref.Server().Dispatch, rp, &rbuf, rw, args...)
			require.Equal(t, want, got, "%q", args)
			require.Equal(t, rp.Resp3, np.Resp3, "%q", args)
		}
		require.Equal(t, answer(ref.Server().Dispatch, rp, &rbuf, rw, "HELLO", "2"), hello2Reply)
	})
}
