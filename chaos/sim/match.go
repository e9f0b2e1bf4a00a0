package sim

import (
	"strings"

	lua "github.com/yuin/gopher-lua"
)

// gopher-lua's string.match parses and compiles its pattern on every
// call (10 % of a run's CPU: the Acquire script matches the run_id, the
// boot marker and two tokens on every call with the delayed-restart rule
// or a held key). The simulator replaces string.match with one that runs
// the library's own patterns as Go functions, each written to match
// exactly what the Lua pattern matches (Lua's %x, %d and %w are the ASCII
// classes, byte by byte; '$' is the end of the subject), and hands every
// other pattern, and every call with an init argument, to the original.
// (Precompiled Go regexps did the same at 5 % of a fair run's CPU.)
// TestMatchPatterns compares the two on the library's patterns.
var luaPatterns = map[string]func(s string) (caps [2]string, n int){
	// run_id:(%x+): the first "run_id:" followed by a hex digit, and the
	// hex digits from there.
	`run_id:(%x+)`: func(s string) ([2]string, int) {
		const lit = "run_id:"
		for from := 0; ; {
			i := strings.Index(s[from:], lit)
			if i < 0 {
				return [2]string{}, 0
			}
			at := from + i + len(lit)
			if j := span(s, at, isHex); j > at {
				return [2]string{s[at:j]}, 1
			}
			from += i + 1
		}
	},
	// ^(%d+):(%x+)$
	`^(%d+):(%x+)$`: func(s string) ([2]string, int) {
		i := span(s, 0, isDigit)
		if i == 0 || i == len(s) || s[i] != ':' {
			return [2]string{}, 0
		}
		if j := span(s, i+1, isHex); j > i+1 && j == len(s) {
			return [2]string{s[:i], s[i+1:]}, 2
		}
		return [2]string{}, 0
	},
	// ^([%w_-]+)%.(%d+)$
	`^([%w_-]+)%.(%d+)$`: func(s string) ([2]string, int) {
		i := span(s, 0, isWordDash)
		if i == 0 || i == len(s) || s[i] != '.' {
			return [2]string{}, 0
		}
		if j := span(s, i+1, isDigit); j > i+1 && j == len(s) {
			return [2]string{s[:i], s[i+1:]}, 2
		}
		return [2]string{}, 0
	},
}

// span returns the end of the run of bytes of s from i that are in class.
func span(s string, i int, class func(byte) bool) int {
	for i < len(s) && class(s[i]) {
		i++
	}
	return i
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
func isHex(c byte) bool   { return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }
func isWordDash(c byte) bool {
	return isDigit(c) || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || c == '_' || c == '-'
}

// installMatch replaces string.match in L (after the string library is
// open).
func installMatch(L *lua.LState) {
	str, ok := L.GetGlobal("string").(*lua.LTable)
	if !ok {
		return
	}
	orig, ok := str.RawGetString("match").(*lua.LFunction)
	if !ok {
		return
	}
	str.RawSetString("match", L.NewFunction(func(L *lua.LState) int {
		if L.GetTop() == 2 {
			if s, ok := L.Get(1).(lua.LString); ok {
				if p, ok := L.Get(2).(lua.LString); ok {
					if match := luaPatterns[string(p)]; match != nil {
						caps, n := match(string(s))
						for _, c := range caps[:n] {
							L.Push(lua.LString(c))
						}
						return n // no values for no match, as gopher-lua's string.match
					}
				}
			}
		}
		// Anything else: the original, with the same arguments.
		top := L.GetTop()
		L.Push(orig)
		for i := 1; i <= top; i++ {
			L.Push(L.Get(i))
		}
		L.Call(top, lua.MultRet)
		return L.GetTop() - top
	}))
}
