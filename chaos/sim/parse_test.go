package sim

import (
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestParseCommand: whole commands parse to their arguments, in any
// number, and a command cut anywhere is not parsed until it is whole.
func TestParseCommand(t *testing.T) {
	for _, args := range [][]string{
		{"PING"}, {"GET", "k"}, {"SET", "k", "", "PX", "100"}, {"EVALSHA", "abc", "1", "k\r\nx", "tok.1"},
		strings.Split(strings.Repeat("a,", 40)+"end", ","),
		{"eval", strings.Repeat("return 1 -- ", 30), "1", "k", "tok.1"}, {"EVAL", strings.Repeat("x", longLen), "0"},
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
		if len(args) > 1 && len(args[1]) >= longLen && strings.EqualFold(args[0], "eval") {
			// The source is interned: both parses share its bytes.
			first, _, _ := parseCommand([]byte(cmd))
			require.Same(t, unsafe.StringData(first[1]), unsafe.StringData(got[1]))
		}
		for cut := range len(cmd) {
			_, _, ok := parseCommand([]byte(cmd[:cut]))
			require.False(t, ok, "%q cut at %d", cmd, cut)
		}
	}
}
