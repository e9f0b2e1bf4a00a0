package sim

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	lua "github.com/yuin/gopher-lua"
)

// TestMatchPatterns: the simulator's string.match gives what gopher-lua's
// gives, on the library's patterns, for subjects built to hit their edges.
// make test runs it whole in the simulator's job (no -race) and with a
// tenth of the random subjects in the chaos module's -race job.
func TestMatchPatterns(t *testing.T) {
	plain := lua.NewState()
	defer plain.Close()
	fast := lua.NewState()
	defer fast.Close()
	installMatch(fast)
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := "0123456789abcdefABCDEFxyzXYZ_-.:+ \r\n#\xc3\xa9\xff"
	subjects := []string{"", "run_id:", "run_id:abc", "# Server\r\nredis_version:7\r\nrun_id:00ff\r\n", "run_id:xyz run_id:12",
		"123:abc", "123:abc\n", ":abc", "12:", "1:g", "a-b_C.12", "a.b.3", "abc.", ".3", "a.3x", "tok.0012", "x y.3"}
	pieces := []string{"run_id:", "run_id", ":", ".", "12", "ab"}
	random := 6000
	if raceEnabled {
		random = 600 // under -race the 6,000 took 49 s in make test; the matchers have no concurrency to race
	}
	for range random {
		var b strings.Builder
		for range r.IntN(14) {
			if r.IntN(5) == 0 {
				b.WriteString(pieces[r.IntN(len(pieces))])
				continue
			}
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
		subjects = append(subjects, b.String())
	}
	for p := range luaPatterns {
		for _, s := range subjects {
			if got, want := matchVia(fast, s, p), matchVia(plain, s, p); got != want {
				t.Errorf("string.match(%q, %q): simulator %s, gopher-lua %s", s, p, got, want)
			}
		}
	}
	if got, want := matchVia(fast, "abc123", "%a+"), matchVia(plain, "abc123", "%a+"); got != want {
		t.Errorf("fallback: %s, want %s", got, want)
	}
}

func matchVia(L *lua.LState, s, p string) string {
	L.SetGlobal("S", lua.LString(s))
	L.SetGlobal("P", lua.LString(p))
	if err := L.DoString(`R = {string.match(S, P)}; N = select('#', string.match(S, P))`); err != nil {
		return "error: " + err.Error()
	}
	var out []string
	tb := L.GetGlobal("R").(*lua.LTable)
	n := int(L.GetGlobal("N").(lua.LNumber))
	for i := 1; i <= n; i++ {
		out = append(out, fmt.Sprintf("%q", tb.RawGetInt(i).String()))
	}
	return fmt.Sprint(n, out)
}
