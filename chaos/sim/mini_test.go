package sim

import (
	"bufio"
	"bytes"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/stretchr/testify/require"
)

// TestMiniReuse: an engine a node process left (keys of every type, with
// TTLs, a hook) answers, once put back and taken again, as a fresh
// miniredis does: no key, no hook.
func TestMiniReuse(t *testing.T) {
	t0 := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	hooked := 0
	for range 3 {
		m := takeMini()
		m.SetTime(t0)
		m.ClockTTL(true)
		m.Server().SetPreHook(func(*server.Peer, string, ...string) bool { hooked++; return false })
		p := newPeer()
		for _, args := range [][]string{
			{"SET", "s", "v", "PX", "100000"}, {"HSET", "h", "f", "1"}, {"ZADD", "z", "1", "a"}, {"RPUSH", "l", "x"},
			{"SADD", "set", "m"}, {"INCR", "redlease:fence:{k}"}, {"SELECT", "1"}, {"SET", "db1", "v"},
		} {
			answer(m, p, args)
		}
		require.NotEmpty(t, m.Keys())
		putMini(m)
	}
	require.Positive(t, hooked)
	hooked = 0
	ref := miniredis.NewMiniRedis()
	defer ref.Close()
	if c, err := ref.Dial(); err == nil {
		_ = c.Close()
	}
	for _, m := range []*miniredis.Miniredis{ref, takeMini(), takeMini()} {
		m.SetTime(t0.Add(time.Second))
		m.ClockTTL(true)
		var got []string
		p := newPeer()
		for _, args := range [][]string{
			{"KEYS", "*"}, {"GET", "s"}, {"HGETALL", "h"}, {"ZRANGE", "z", "0", "-1"}, {"LRANGE", "l", "0", "-1"},
			{"SMEMBERS", "set"}, {"GET", "redlease:fence:{k}"}, {"DBSIZE"}, {"SELECT", "1"}, {"KEYS", "*"}, {"DBSIZE"},
			{"SET", "s", "w", "PX", "50"}, {"PTTL", "s"},
		} {
			got = append(got, answer(m, p, args))
		}
		require.Equal(t, []string{"*0\r\n", "$-1\r\n", "*0\r\n", "*0\r\n", "*0\r\n", "*0\r\n", "$-1\r\n", ":0\r\n", "+OK\r\n", "*0\r\n", ":0\r\n", "+OK\r\n", ":50\r\n"}, got)
	}
	require.Zero(t, hooked, "a hook of an engine put back ran")
}

type peer struct {
	buf bytes.Buffer
	w   *bufio.Writer
	p   *server.Peer
}

func newPeer() *peer {
	p := &peer{}
	p.w = bufio.NewWriter(&p.buf)
	p.p = server.NewPeer(p.w)
	return p
}

// answer dispatches args on m through p and returns the reply.
func answer(m *miniredis.Miniredis, p *peer, args []string) string {
	p.buf.Reset()
	m.Server().Dispatch(p.p, args)
	_ = p.w.Flush()
	return p.buf.String()
}
