package redistest

import (
	"fmt"
	"time"
)

// waitMaxPolls bounds WaitFor's loop in count, whatever the probe measures.
const waitMaxPolls = 100_000

// WaitFor polls cond every tick, from now, until it holds, and fails tb
// (Fatalf) once it has not held within the window the same run allows:
// Allowance(bound, multiple, from, now), recomputed at every poll, so a
// stretch the process was kept from running widens the window by multiple
// times that stall and nothing else does. The failure message says what
// was awaited (what, args) and how the window was derived (Explain). The
// loop is bounded in count (waitMaxPolls) as well as in time.
func (p *StallProbe) WaitFor(tb TB, bound time.Duration, multiple int, tick time.Duration, cond func() bool, what string, args ...any) {
	tb.Helper()
	from := time.Now()
	for range waitMaxPolls {
		if cond() {
			return
		}
		now := time.Now()
		if now.Sub(from) > p.Allowance(bound, multiple, from, now) {
			if cond() { // one last look: the check may have been starved too
				return
			}
			tb.Fatalf("%s: not within %v: %s", fmt.Sprintf(what, args...), now.Sub(from).Round(time.Millisecond), p.Explain(bound, multiple, from, now))
			return
		}
		time.Sleep(tick)
	}
	tb.Fatalf("%s: not after %d polls: %s", fmt.Sprintf(what, args...), waitMaxPolls, p.Explain(bound, multiple, from, time.Now()))
}
