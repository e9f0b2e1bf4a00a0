package sim

import (
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestParseCommand: whole commands parse to their arguments, in any
// number, and a command cut anywhere is not parsed until it is whole.
func TestParseCommand(t *testing.T) {
	for _, args := range [][]string{
		{"PING"}, {"GET", "k"}, {"SET", "k", "", "PX", "100"}, {"EVALSHA", "abc", "1", "k\r\nx", "tok.1"},
		strings.Split(strings.Repeat("a,", 40)+"end", ","),
	} {
		var b strings.Builder
		b.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
		for _, a := range args {
			b.WriteString("$" + strconv.Itoa(len(a)) + "\r\n" + a + "\r\n")
		}
		cmd := b.String()
		two := []byte(cmd + cmd)
		got, n, ok := parseCommand(two)
		require.True(t, ok)
		require.Equal(t, len(cmd), n)
		require.Equal(t, args, got)
		got, n, ok = parseCommand(two[n:])
		require.True(t, ok)
		require.Equal(t, len(cmd), n)
		require.Equal(t, args, got)
		for cut := range len(cmd) {
			_, _, ok := parseCommand([]byte(cmd[:cut]))
			require.False(t, ok, "%q cut at %d", cmd, cut)
		}
	}
}
