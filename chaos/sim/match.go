package sim

import (
	"regexp"

	lua "github.com/yuin/gopher-lua"
)

// gopher-lua's string.match parses and compiles its pattern on every
// call (10 % of a run's CPU: the Acquire script matches the run_id, the
// boot marker and two tokens on every call with the delayed-restart rule
// or a held key). The simulator replaces string.match with one that runs
// the library's own patterns as precompiled Go regexps, each written to
// match exactly what the Lua pattern matches (Lua's %x, %d and %w are the
// ASCII classes; '$' is the end of the subject in both), and hands every
// other pattern, and every call with an init argument, to the original.
// TestMatchPatterns compares the two on the library's patterns.
var luaPatterns = map[string]*regexp.Regexp{
	`run_id:(%x+)`:       regexp.MustCompile(`run_id:([0-9A-Fa-f]+)`),
	`^(%d+):(%x+)$`:      regexp.MustCompile(`^([0-9]+):([0-9A-Fa-f]+)$`),
	`^([%w_-]+)%.(%d+)$`: regexp.MustCompile(`^([0-9A-Za-z_-]+)\.([0-9]+)$`),
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
					if re := luaPatterns[string(p)]; re != nil {
						return pushMatch(L, re, string(s))
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

func pushMatch(L *lua.LState, re *regexp.Regexp, s string) int {
	m := re.FindStringSubmatch(s)
	if m == nil {
		return 0 // as gopher-lua's string.match: no values (a Lua assignment reads nil)
	}
	if len(m) == 1 {
		L.Push(lua.LString(m[0]))
		return 1
	}
	for _, c := range m[1:] {
		L.Push(lua.LString(c))
	}
	return len(m) - 1
}
