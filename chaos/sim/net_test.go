package sim

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
)

// readConn is a conn with replies delivered and not yet read, for Read alone.
func readConn(settle time.Duration, replies ...message) *conn {
	c := &conn{notify: make(chan struct{}, 1), done: make(chan struct{}), settle: settle}
	for _, m := range replies {
		c.rbuf = append(c.rbuf, m.reply...)
		c.segs = append(c.segs, segment{n: len(m.reply), push: m.push})
	}
	return c
}

// TestReadHandsOnAPushAfterWhatTheReplyBeforeItWoke: a reader that finds a
// reply and a pushed message waiting reads them in two Reads, the push
// settle after the reply, so that what the reply woke runs first in every
// run (fair-single 13).
func TestReadHandsOnAPushAfterWhatTheReplyBeforeItWoke(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reply := []byte("*3\r\n$9\r\nsubscribe\r\n$1\r\nc\r\n:1\r\n")
		push := []byte("*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nr\r\n")
		c := readConn(3, message{reply: reply}, message{reply: push, push: true})
		b := make([]byte, 4096)
		start := time.Now()

		n, err := c.Read(b)
		require.NoError(t, err)
		require.Equal(t, string(reply), string(b[:n]), "one Read returns one reply at most")
		require.Zero(t, time.Since(start))

		n, err = c.Read(b)
		require.NoError(t, err)
		require.Equal(t, string(push), string(b[:n]))
		require.Equal(t, 3*time.Nanosecond, time.Since(start), "the push is read settle after the reply read at its instant")
	})
}

// TestReadTakesRepliesAndLatePushesAtOnce: only a push that a Read starts at
// the instant the reply before it was read waits; replies, and a push read
// at a later instant, are read at once, a part at a time if b is short.
func TestReadTakesRepliesAndLatePushesAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		push := []byte("*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$1\r\nr\r\n")
		c := readConn(3, message{reply: []byte("+OK\r\n")}, message{reply: []byte(":1\r\n")}, message{reply: push, push: true})
		start := time.Now()
		b := make([]byte, 4096)
		n, _ := c.Read(b)
		require.Equal(t, "+OK\r\n", string(b[:n]))
		n, _ = c.Read(b)
		require.Equal(t, ":1\r\n", string(b[:n]))
		require.Zero(t, time.Since(start), "a reply after a reply is read at once")

		time.Sleep(time.Microsecond)
		small := make([]byte, 5)
		var got []byte
		for len(got) < len(push) {
			n, err := c.Read(small)
			require.NoError(t, err)
			got = append(got, small[:n]...)
		}
		require.Equal(t, string(push), string(got))
		require.Equal(t, time.Microsecond, time.Since(start), "a push read at a later instant, and the rest of one begun, are read at once")
	})
}
