package sim

import (
	"bufio"
	"bytes"
	"fmt"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/stretchr/testify/require"
	lua "github.com/yuin/gopher-lua"
)

// TestReplyToLua: redis.call's reply conversion gives what miniredis's
// binding gives (server.ParseReply, then its conversion, kept here as the
// reference) on the replies of a miniredis node, and on malformed ones.
func TestReplyToLua(t *testing.T) {
	m := miniredis.NewMiniRedis()
	if c, err := m.Dial(); err == nil {
		_ = c.Close()
	}
	defer m.Close()
	L := lua.NewState()
	defer L.Close()
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	peer := server.NewPeer(w)
	cmds := [][]string{
		{"SET", "k", "v"}, {"GET", "k"}, {"GET", "none"}, {"SET", "e", ""}, {"GET", "e"},
		{"INCR", "n"}, {"PTTL", "k"}, {"PEXPIRE", "k", "100"}, {"TIME"},
		{"ZADD", "z", "1", "a", "2", "b", "-3", "@a"}, {"ZRANGEBYSCORE", "z", "0", "+inf"},
		{"ZRANGEBYSCORE", "z", "5", "+inf"}, {"ZRANGEBYSCORE", "z", "0", "+inf", "LIMIT", "0", "1"},
		{"HSET", "h", "f", "1"}, {"GET", "h"}, {"INCR", "k"}, {"NOSUCH"}, {"EXISTS", "k", "z"},
		{"DEL", "k"}, {"PTTL", "k"}, {"ZREM", "z", "a", "@a"}, {"MGET", "n", "none", "e"},
	}
	var replies [][]byte
	for _, args := range cmds {
		buf.Reset()
		m.Server().Dispatch(peer, args)
		require.NoError(t, w.Flush())
		replies = append(replies, bytes.Clone(buf.Bytes()))
	}
	for _, raw := range []string{"", "+OK", ":\r\n", ":x\r\n", "$3\r\nab", "$x\r\n", "*2\r\n:1\r\n", "*1\r\n-ERR in\r\n",
		"*0\r\n", "*-1\r\n", "$-1\r\n", "*2\r\n*1\r\n+OK\r\n$-1\r\n", "%1\r\n", "x\r\n"} {
		replies = append(replies, []byte(raw))
	}
	for _, b := range replies {
		got, _, gerr := replyToLua(L, b)
		want, werr := server.ParseReply(bufio.NewReader(bytes.NewReader(b)))
		if werr != nil {
			require.Error(t, gerr, "%q", b)
			require.Equal(t, werr.Error(), gerr.Error(), "%q", b)
			continue
		}
		require.NoError(t, gerr, "%q", b)
		require.Equal(t, show(refToLua(L, want)), show(got), "%q", b)
	}
}

// refToLua is miniredis's conversion of a parsed reply to Lua.
func refToLua(L *lua.LState, v any) lua.LValue {
	switch r := v.(type) {
	case nil:
		return lua.LFalse
	case int:
		return lua.LNumber(r)
	case string:
		return lua.LString(r)
	case server.Simple:
		t := L.NewTable()
		t.RawSetString("ok", lua.LString(string(r)))
		return t
	case []any:
		t := L.NewTable()
		for i, e := range r {
			t.RawSetInt(i+1, refToLua(L, e))
		}
		return t
	default:
		return lua.LString(fmt.Sprint(r))
	}
}

// show renders a Lua value with its type, tables in full.
func show(v lua.LValue) string {
	t, ok := v.(*lua.LTable)
	if !ok {
		return fmt.Sprintf("%s:%s", v.Type(), v)
	}
	out := "{"
	t.ForEach(func(k, e lua.LValue) { out += show(k) + "=" + show(e) + " " })
	return out + "}"
}

// TestLuaVMReset: a Lua state goes back for reuse after scripts that set
// KEYS and ARGV, not after one that set a global of its own.
func TestLuaVMReset(t *testing.T) {
	vm := newLuaVM()
	defer vm.L.Close()
	require.True(t, vm.reset(), "a new state")
	require.NoError(t, vm.L.DoString(`KEYS = {"k"}; ARGV = {"a"}; local x = string.match("a.1", "^([%w_-]+)%.(%d+)$"); return x`))
	require.True(t, vm.reset(), "after KEYS, ARGV and locals")
	require.Equal(t, lua.LNil, vm.L.GetGlobal("KEYS"))
	require.Equal(t, 0, vm.L.GetTop())
	require.NoError(t, vm.L.DoString(`leaked = 1`))
	require.False(t, vm.reset(), "after a script set a global")
}
