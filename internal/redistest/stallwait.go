package redistest

import (
	"context"
	"fmt"
	"time"
)

// waitMaxPolls bounds WaitFor's loop in count, whatever the probe measures.
const waitMaxPolls = 100_000

// waitCap is how long WaitFor waits at most, whatever the probe measures:
// a machine that keeps the process from running a third of the time or
// more widens a window with multiple 3 as fast as time passes, and the
// wait must still end.
func waitCap(bound time.Duration) time.Duration { return 10*bound + 10*time.Second }

// WaitFor polls cond every tick, from now, until it holds, and fails tb
// (Fatalf) once it has not held within the window the same run allows:
// Allowance(bound, multiple, from, now), recomputed at every poll, so a
// stretch the process was kept from running widens the window by multiple
// times that stall and nothing else does. The failure message says what
// was awaited (what, args) and how the window was derived (Explain). The
// loop is bounded in count (waitMaxPolls) and in time (waitCap) as well.
func (p *StallProbe) WaitFor(tb TB, bound time.Duration, multiple int, tick time.Duration, cond func() bool, what string, args ...any) {
	tb.Helper()
	from := time.Now()
	for range waitMaxPolls {
		if cond() {
			return
		}
		now := time.Now()
		if now.Sub(from) > min(p.Allowance(bound, multiple, from, now), waitCap(bound)) {
			if p.left(from, bound, multiple) > 0 {
				continue // a stall that ended just before now had not been counted yet
			}
			if cond() { // one last look: the check may have been starved too
				return
			}
			tb.Fatalf("%s: not within %v: %s", fmt.Sprintf(what, args...), now.Sub(from).Round(time.Millisecond), p.explainWait(bound, multiple, from, now))
			return
		}
		time.Sleep(tick)
	}
	tb.Fatalf("%s: not after %d polls: %s", fmt.Sprintf(what, args...), waitMaxPolls, p.explainWait(bound, multiple, from, time.Now()))
}

// Within reports whether a stretch that began at from and took took ended
// inside the window Allowance(bound, multiple, from, from+took), with a
// message that gives took and how the window was derived, for the failure.
func (p *StallProbe) Within(took, bound time.Duration, multiple int, from time.Time) (bool, string) {
	to := from.Add(took)
	p.settle(to)
	return took < p.Allowance(bound, multiple, from, to),
		fmt.Sprintf("took %v; %s", took.Round(time.Millisecond), p.Explain(bound, multiple, from, to))
}

// explainWait is Explain for a wait, which also says when the window was
// cut to waitCap(bound).
func (p *StallProbe) explainWait(bound time.Duration, multiple int, from, to time.Time) string {
	e := p.Explain(bound, multiple, from, to)
	if p.Allowance(bound, multiple, from, to) > waitCap(bound) {
		e += fmt.Sprintf("; cut to the wait's cap %v (10 × bound + 10 s)", waitCap(bound))
	}
	return e
}

// left is how much of the window a wait that began at from has left now:
// min(Allowance(bound, multiple, from, now), waitCap(bound)) less the time
// since from, once the probe has recorded a stall that just ended.
func (p *StallProbe) left(from time.Time, bound time.Duration, multiple int) time.Duration {
	now := time.Now()
	p.settle(now)
	return min(p.Allowance(bound, multiple, from, now), waitCap(bound)) - now.Sub(from)
}

// settle waits until the probe has recorded a wake after t (at most about
// a second, or until the probe stops): after a stall, this process may run
// a caller before the probe, and the wake that ends the stall, which
// counts it, must be in the record before a window is computed.
func (p *StallProbe) settle(t time.Time) {
	for range 1000 {
		p.mu.Lock()
		n := len(p.wakes)
		recorded := n > 0 && p.wakes[n-1].at.After(t)
		p.mu.Unlock()
		if recorded {
			return
		}
		select {
		case <-p.done:
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// Await receives from ch and returns what it received (the zero value once
// ch is closed), and fails tb (Fatalf) once nothing has arrived within the
// window the same run allows: Allowance(bound, multiple, from, now) from
// the call on, recomputed each time the window ends, so a stretch the
// process was kept from running widens it by multiple times that stall and
// nothing else does. The failure message says what was awaited (what,
// args) and how the window was derived (Explain). The wait is bounded in
// count (waitMaxPolls) and in time (waitCap) as well. Await is a function,
// not a method of StallProbe, because a method cannot take a type
// parameter: it awaits a channel of any element type.
func Await[T any](tb TB, p *StallProbe, ch <-chan T, bound time.Duration, multiple int, what string, args ...any) T {
	tb.Helper()
	from := time.Now()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	for range waitMaxPolls {
		select {
		case v := <-ch:
			return v
		case <-timer.C:
		}
		if left := p.left(from, bound, multiple); left > 0 {
			timer.Reset(left)
			continue
		}
		now := time.Now()
		select { // one last look: the sender may have been starved too
		case v := <-ch:
			return v
		default:
		}
		tb.Fatalf("%s: not within %v: %s", fmt.Sprintf(what, args...), now.Sub(from).Round(time.Millisecond), p.explainWait(bound, multiple, from, now))
		var zero T
		return zero
	}
	tb.Fatalf("%s: not after %d waits: %s", fmt.Sprintf(what, args...), waitMaxPolls, p.explainWait(bound, multiple, from, time.Now()))
	var zero T
	return zero
}

// Lazy is a part of a failure message computed when the message is
// written (its String), not when the wait begins: pass
// Lazy(func() string { ... }) among the args of WaitFor or Await to
// report the state at the failure.
type Lazy func() string

// String returns what f computes now.
func (f Lazy) String() string { return f() }

// SoftTB is a TB whose Fatalf records the failure and returns, leaving the
// goroutine running: for WaitFor or Await inside a function the code under test
// runs (a handler, a Do's function), which must return, or outside the
// test's goroutine. Failed returns what was recorded; the caller reports
// it (t.Error) or acts on it.
type SoftTB struct {
	TB
	failed string
}

// Fatalf records the failure; the last one recorded is kept.
func (s *SoftTB) Fatalf(format string, args ...any) { s.failed = fmt.Sprintf(format, args...) }

// Failed returns the failure recorded, "" if none.
func (s *SoftTB) Failed() string { return s.failed }

// BoundedCalls returns a runner of calls that must return by their ctx's
// deadline: it runs f with a ctx of CallTimeout (under ctx) and fails tb
// (Errorf) unless f returned within CallTimeout plus CallSlack, widened by
// what probe measured of this machine's stalls meanwhile (Within, three
// times the stall). It logs what each call returned and how long it took,
// and returns f's error for the caller's own checks.
func BoundedCalls(ctx context.Context, tb interface {
	Helper()
	Logf(string, ...any)
	Errorf(string, ...any)
}, probe *StallProbe) func(what string, f func(context.Context) error) error {
	return func(what string, f func(context.Context) error) error {
		tb.Helper()
		cctx, cancel := context.WithTimeout(ctx, CallTimeout)
		defer cancel()
		start := time.Now()
		err := f(cctx)
		took := time.Since(start)
		tb.Logf("%s: %v after %v", what, err, took.Round(time.Millisecond))
		if ok, why := probe.Within(took, CallTimeout+CallSlack, 3, start); !ok {
			tb.Errorf("%s must return near its ctx's deadline (outside the window derived from this run): %s", what, why)
		}
		return err
	}
}

// CallTimeout is the ctx BoundedCalls gives each call; CallSlack what it
// allows past it before the machine's measured stalls.
const (
	CallTimeout = 300 * time.Millisecond
	CallSlack   = 400 * time.Millisecond
)
