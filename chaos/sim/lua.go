package sim

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/alicebob/miniredis/v2/server"
	lua "github.com/yuin/gopher-lua"
	"github.com/yuin/gopher-lua/parse"
)

// The simulator runs EVAL and EVALSHA itself, on one Lua state per node
// that lives as long as the node's process, as Redis does (then reset and
// kept for a later node: see luaVM): miniredis
// builds a fresh Lua state (and opens every library) for each call, which
// cost 60 % of a run's CPU. The scripts are the library's own, run by the
// same interpreter (gopher-lua) as miniredis; redis.call dispatches into
// the node's miniredis as miniredis's own binding does.

// argWord finds a use of the vararg compatibility table "arg".
var argWord = regexp.MustCompile(`\barg\b`)

// protos caches compiled scripts by source.
var protos sync.Map // string → *lua.FunctionProto

func compileScript(src string) (*lua.FunctionProto, error) {
	if p, ok := protos.Load(src); ok {
		return p.(*lua.FunctionProto), nil
	}
	chunk, err := parse.Parse(strings.NewReader(src), "@user_script")
	if err != nil {
		return nil, err
	}
	p, err := lua.Compile(chunk, "user_script")
	if err != nil {
		return nil, err
	}
	if !argWord.MatchString(src) {
		// The main chunk is vararg; gopher-lua builds Lua 5.0's "arg"
		// table (with a 32-slot map for its "n") on every call unless
		// told the chunk never reads it (18 % of a run's allocations).
		p.IsVarArg &^= lua.VarArgNeedsArg
	}
	protos.Store(src, p)
	return p, nil
}

// sha1hex is src's SHA1 in hex. Sources are the library's few scripts,
// each seen on every EVAL (a node's first call of it after NOSCRIPT) by
// the node and the checks that read script lines: their SHA1s are cached
// (hashing a few KiB and copying it to a []byte was 5 % of a run's
// allocations).
func sha1hex(src string) string {
	if h, ok := shas.Load(src); ok {
		return h.(string)
	}
	h := sha1.Sum([]byte(src))
	hs := hex.EncodeToString(h[:])
	if shaCount.Add(1) <= maxShas {
		shas.Store(src, hs)
	}
	return hs
}

// shas caches sha1hex by source, at most maxShas of them (tests may EVAL
// sources of their own).
var (
	shas     sync.Map // string → string
	shaCount atomic.Int64
)

const maxShas = 256

// scriptLine splits an EVAL or EVALSHA command line by the key count it
// declares (args[2], numkeys): the script's SHA1 (of its source, for
// EVAL), its KEYS and its ARGV, as the script sees them. Whoever reads a
// script's arguments reads them from here, by the script's documented
// layout (internal/script), never at a fixed offset of the command line:
// a key added to a script moves every ARGV. ok is false for any other
// command, or a line whose numkeys is not a count of its arguments.
func scriptLine(args []string) (sha string, keys, argv []string, ok bool) {
	if len(args) < 3 {
		return "", nil, nil, false
	}
	switch {
	case strings.EqualFold(args[0], "evalsha"):
		sha = strings.ToLower(args[1])
	case strings.EqualFold(args[0], "eval"):
		sha = sha1hex(args[1])
	default:
		return "", nil, nil, false
	}
	nk, err := strconv.Atoi(args[2])
	if err != nil || nk < 0 || 3+nk > len(args) {
		return "", nil, nil, false
	}
	return sha, args[3 : 3+nk], args[3+nk:], true
}

// luaState returns the node's Lua state, made on first use (or taken
// from luaVMs). Call with n.mu held.
func (n *Node) luaState() *lua.LState {
	if n.lua != nil {
		return n.lua.L
	}
	vm, _ := luaVMs.Get().(*luaVM)
	if vm == nil {
		vm = newLuaVM()
	}
	vm.node = n
	n.lua = vm
	return vm.L
}

// dropLua gives the node's Lua state back (its process ended). Call with
// n.mu held.
func (n *Node) dropLua() {
	if n.lua == nil {
		return
	}
	n.lua.put()
	n.lua = nil
}

// luaVM is a Lua state with the libraries a script sees, and the node
// its redis.call serves.
//
// A node process's Lua state ends with it, as in Redis, but making one
// (opening the libraries: a few hundred tables and functions) was 2-3 %
// of a run's CPU and a sixth of its allocated bytes, so a state whose
// node stopped is kept for the next node that needs one, in any run.
// What a script could leave in it is reset or checked first (put): the
// stack is emptied, KEYS and ARGV cleared, and a state whose globals are
// not the ones it was made with (a script that set a global, which Redis
// refuses) is closed, never reused. The library's scripts use locals
// only.
type luaVM struct {
	L       *lua.LState
	node    *Node
	globals int // globals when made
	// chunks holds a main-chunk function per compiled script, made on
	// its first call in this state (a new one per EVAL: 0.9 % of
	// quorum5-restart's allocations): it has no upvalues, and its
	// environment is set back to the state's globals before every call.
	chunks map[*lua.FunctionProto]*lua.LFunction
}

// maxChunks bounds luaVM.chunks (the library has a few scripts; tests
// may EVAL sources of their own).
const maxChunks = 64

// chunk is proto's main-chunk function in vm's state.
func (vm *luaVM) chunk(proto *lua.FunctionProto) *lua.LFunction {
	fn := vm.chunks[proto]
	if fn == nil {
		fn = vm.L.NewFunctionFromProto(proto)
		if proto.NumUpvalues == 0 && len(vm.chunks) < maxChunks {
			if vm.chunks == nil {
				vm.chunks = map[*lua.FunctionProto]*lua.LFunction{}
			}
			vm.chunks[proto] = fn
		}
	}
	fn.Env = vm.L.Env
	return fn
}

var luaVMs sync.Pool // *luaVM

func newLuaVM() *luaVM {
	vm := &luaVM{}
	// The default registry (5,120 slots) and call stack were a large
	// share of a run's allocations, one set per node process; the
	// library's scripts need a few dozen slots and grow it if not.
	L := lua.NewState(lua.Options{SkipOpenLibs: true, RegistrySize: 256, RegistryMaxSize: 256 * 1024, CallStackSize: 64})
	for _, lib := range []struct {
		name string
		f    lua.LGFunction
	}{{lua.BaseLibName, lua.OpenBase}, {lua.TabLibName, lua.OpenTable}, {lua.StringLibName, lua.OpenString}, {lua.MathLibName, lua.OpenMath}} {
		L.Push(L.NewFunction(lib.f))
		L.Push(lua.LString(lib.name))
		L.Call(1, 0)
	}
	installMatch(L)
	mod := L.NewTable()
	mod.RawSetString("call", L.NewFunction(func(L *lua.LState) int { return vm.node.luaCall(L, true) }))
	mod.RawSetString("pcall", L.NewFunction(func(L *lua.LState) int { return vm.node.luaCall(L, false) }))
	mod.RawSetString("error_reply", L.NewFunction(func(L *lua.LState) int {
		t := L.CreateTable(0, 1)
		t.RawSetString("err", lua.LString(L.CheckString(1)))
		L.Push(t)
		return 1
	}))
	mod.RawSetString("status_reply", L.NewFunction(func(L *lua.LState) int {
		t := L.CreateTable(0, 1)
		t.RawSetString("ok", lua.LString(L.CheckString(1)))
		L.Push(t)
		return 1
	}))
	mod.RawSetString("log", L.NewFunction(func(*lua.LState) int { return 0 }))
	for i, name := range []string{"LOG_DEBUG", "LOG_VERBOSE", "LOG_NOTICE", "LOG_WARNING"} {
		mod.RawSetString(name, lua.LNumber(i))
	}
	L.SetGlobal("redis", mod)
	vm.L, vm.globals = L, countGlobals(L)
	return vm
}

// put resets vm and keeps it for reuse, or closes it if a script changed
// its globals.
func (vm *luaVM) put() {
	vm.node = nil
	if !vm.reset() {
		vm.L.Close()
		return
	}
	luaVMs.Put(vm)
}

// reset empties the stack, clears KEYS and ARGV, and reports whether the
// globals are the ones the state was made with.
func (vm *luaVM) reset() bool {
	L := vm.L
	L.SetTop(0)
	L.SetGlobal("KEYS", lua.LNil)
	L.SetGlobal("ARGV", lua.LNil)
	return countGlobals(L) == vm.globals
}

func countGlobals(L *lua.LState) int {
	n := 0
	L.G.Global.ForEach(func(lua.LValue, lua.LValue) { n++ })
	return n
}

// evalHook answers EVAL, EVALSHA and SCRIPT LOAD/EXISTS/FLUSH. It reports
// false for anything else (miniredis answers).
func (n *Node) evalHook(p *server.Peer, cmd string, args []string) bool {
	switch cmd {
	case "SCRIPT":
		if len(args) == 0 {
			return false
		}
		switch strings.ToUpper(args[0]) {
		case "LOAD":
			if len(args) != 2 {
				return false
			}
			proto, err := compileScript(args[1])
			if err != nil {
				p.WriteError("ERR Error compiling script: " + err.Error())
				return true
			}
			sha := sha1hex(args[1])
			n.scripts[sha] = proto
			p.WriteBulk(sha)
			return true
		case "FLUSH":
			clear(n.scripts)
			p.WriteOK()
			return true
		case "EXISTS":
			p.WriteLen(len(args) - 1)
			for _, sha := range args[1:] {
				if _, ok := n.scripts[strings.ToLower(sha)]; ok {
					p.WriteInt(1)
				} else {
					p.WriteInt(0)
				}
			}
			return true
		}
		return false
	case "EVAL", "EVALSHA":
	default:
		return false
	}
	if len(args) < 2 {
		p.WriteError(fmt.Sprintf("ERR wrong number of arguments for '%s' command", strings.ToLower(cmd)))
		return true
	}
	var proto *lua.FunctionProto
	if cmd == "EVALSHA" {
		pr, ok := n.scripts[strings.ToLower(args[0])]
		if !ok {
			p.WriteError("NOSCRIPT No matching script. Please use EVAL.")
			return true
		}
		proto = pr
	}
	nkeys, err := strconv.Atoi(args[1])
	if err != nil || nkeys < 0 || nkeys > len(args)-2 {
		p.WriteError("ERR Number of keys can't be greater than number of args")
		return true
	}
	if cmd == "EVAL" {
		src := args[0]
		if proto, err = compileScript(src); err != nil {
			p.WriteError("ERR Error compiling script: " + err.Error())
			return true
		}
		n.scripts[sha1hex(src)] = proto
	}
	L := n.luaState()
	keys, argv := L.CreateTable(nkeys, 0), L.CreateTable(len(args)-2-nkeys, 0)
	for i, k := range args[2 : 2+nkeys] {
		keys.RawSetInt(i+1, lua.LString(k))
	}
	for i, a := range args[2+nkeys:] {
		argv.RawSetInt(i+1, lua.LString(a))
	}
	L.SetGlobal("KEYS", keys)
	L.SetGlobal("ARGV", argv)
	defer L.SetTop(0)
	L.Push(n.lua.chunk(proto))
	if err := L.PCall(0, 1, nil); err != nil {
		p.WriteError("ERR user_script: " + err.Error())
		return true
	}
	writeLua(p, L.Get(-1))
	return true
}

// luaCallBufs are a node's redis.call peer and buffers.
type luaCallBufs struct {
	buf  bytes.Buffer
	w    *bufio.Writer
	peer *server.Peer
	// args is the command line's slice, reused: neither miniredis's
	// commands nor the node's hook keep it past the call (a new one per
	// call: 4.6 % of quorum5-restart's allocations). Its strings are
	// cleared after each call.
	args []string
}

// luaCall is redis.call (raise) and redis.pcall (return {err=…}).
func (n *Node) luaCall(L *lua.LState, raise bool) int {
	top := L.GetTop()
	lc := &n.lcall
	args := lc.args[:0]
	defer func() { clear(args); lc.args = args[:0] }()
	for i := 1; i <= top; i++ {
		switch a := L.Get(i).(type) {
		case lua.LNumber:
			args = append(args, numberArg(a))
		case lua.LString:
			args = append(args, string(a))
		default:
			L.RaiseError("Lua redis lib command arguments must be strings or integers")
			return 0
		}
	}
	if len(args) == 0 {
		L.RaiseError("Please specify at least one argument for this redis lib call")
		return 0
	}
	// One peer and buffers per node, reused: redis.call runs under the
	// node's mutex, one call at a time (fresh 4 KiB bufio buffers per
	// call were a third of a run's allocations).
	if lc.peer == nil {
		lc.w = bufio.NewWriterSize(&lc.buf, 256)
		lc.peer = server.NewPeer(lc.w)
	}
	lc.buf.Reset()
	n.noteScriptWrite(args)
	n.m.Server().Dispatch(lc.peer, args)
	_ = lc.w.Flush()
	res, _, err := replyToLua(L, lc.buf.Bytes())
	if err != nil {
		if raise {
			L.RaiseError("%s", err.Error())
			return 0
		}
		t := L.CreateTable(0, 1)
		t.RawSetString("err", lua.LString(err.Error()))
		L.Push(t)
		return 1
	}
	L.Push(res)
	return 1
}

// noteScriptWrite records the keys a script's redis.call writes that the
// script did not declare (see Node.scriptKeys), with their states before
// the first such write when the node has a replica.
func (n *Node) noteScriptWrite(args []string) {
	for _, k := range writeKeys(args) {
		if slices.Contains(n.declared, k) || slices.Contains(n.scriptKeys, k) {
			continue
		}
		n.scriptKeys = append(n.scriptKeys, k)
		if n.replica != nil {
			n.scriptPre = append(n.scriptPre, n.keyStatesLocked([]string{k})...)
		}
	}
}

// numberArg is a.String() (what miniredis's binding sends for a number),
// without fmt for an integer.
func numberArg(a lua.LNumber) string {
	if i := int64(a); float64(a) == float64(i) {
		return strconv.FormatInt(i, 10)
	}
	return a.String()
}

// replyToLua converts the RESP2 reply at the front of b to a Lua value, as
// miniredis's binding does (server.ParseReply, then its conversion: a
// status is a table {ok = status}, nil bulks and arrays are false, an
// error anywhere in the reply is the error), without the parsed reply in
// between (a []any of strings and ints: 5 % of a fair run's CPU). It
// returns the bytes after the reply.
func replyToLua(L *lua.LState, b []byte) (lua.LValue, []byte, error) {
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		return nil, nil, io.EOF
	}
	// The line's bytes, read in place: a string is made only of what a
	// Lua value or an error keeps.
	line, rest := b[:i+1], b[i+1:]
	if len(line) < 3 {
		return nil, nil, server.ErrProtocol
	}
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+':
		t := L.CreateTable(0, 1) // NewTable's first string key makes a 32-slot map
		t.RawSetString("ok", lua.LString(string(body)))
		return t, rest, nil
	case '-':
		return nil, nil, errors.New(string(body))
	case ':':
		if len(body) == 0 {
			return lua.LNumber(0), rest, nil
		}
		v, err := strconv.Atoi(string(body))
		if err != nil {
			return nil, nil, server.ErrProtocol
		}
		return lua.LNumber(v), rest, nil
	case '$':
		size, err := strconv.Atoi(string(body))
		if err != nil {
			return nil, nil, err
		}
		if size < 0 {
			return lua.LFalse, rest, nil
		}
		if len(rest) < size+2 {
			return nil, nil, io.EOF
		}
		return lua.LString(rest[:size]), rest[size+2:], nil
	case '*':
		count, err := strconv.Atoi(string(body))
		if err != nil {
			return nil, nil, server.ErrProtocol
		}
		if count < 0 {
			return lua.LFalse, rest, nil
		}
		t := L.CreateTable(count, 0)
		for k := 1; k <= count; k++ {
			var e lua.LValue
			if e, rest, err = replyToLua(L, rest); err != nil {
				return nil, nil, err
			}
			t.RawSetInt(k, e)
		}
		return t, rest, nil
	default:
		return nil, nil, server.ErrProtocol
	}
}

// writeLua writes a script's result as Redis converts it.
func writeLua(p *server.Peer, v lua.LValue) {
	switch r := v.(type) {
	case *lua.LNilType:
		p.WriteNull()
	case lua.LBool:
		if r {
			p.WriteInt(1)
		} else {
			p.WriteNull()
		}
	case lua.LNumber:
		p.WriteInt(int(r))
	case lua.LString:
		p.WriteBulk(string(r))
	case *lua.LTable:
		if e := r.RawGetString("err"); e != lua.LNil {
			p.WriteError(e.String())
			return
		}
		if ok := r.RawGetString("ok"); ok != lua.LNil {
			p.WriteInline(ok.String())
			return
		}
		var items []lua.LValue
		for i := 1; ; i++ {
			e := r.RawGetInt(i)
			if e == lua.LNil {
				break
			}
			items = append(items, e)
		}
		p.WriteLen(len(items))
		for _, e := range items {
			writeLua(p, e)
		}
	default:
		p.WriteNull()
	}
}
