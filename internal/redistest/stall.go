package redistest

import (
	"fmt"
	"sort"
	"sync"
	"time"
)

// StallProbe measures how late this process runs a timer: one goroutine
// sleeps a millisecond at a time and records every wake, when it came and
// how much later than asked. No timer of the process under test is more
// punctual than the probe's in the same stretch: a process the machine
// does not run (busy cores, -race, other test binaries beside it) runs
// neither, and the probe sees the stall.
//
// A timing assertion in a real-process test allows its promised bound plus
// what the probe measured in the same stretch (Allowance), and says so in
// its failure message (Explain): the window is derived from this run, not
// from a guess about the machine.
type StallProbe struct {
	mu    sync.Mutex
	wakes []stallWake // in order of their time
	stop  chan struct{}
	done  chan struct{}
	// betweenWakes, if set (by tests, before the probe starts), runs in
	// the probe's goroutine after each wake is recorded, before its next
	// sleep.
	betweenWakes func()
}

type stallWake struct {
	at   time.Time     // when the probe ran again
	late time.Duration // how much later than a millisecond after the wake before
}

// stallMaxWakes bounds the probe's record (and its loop): a wake a
// millisecond for well over a minute.
const stallMaxWakes = 200_000

// StartStallProbe starts a probe, stopped by tb.Cleanup (or Stop).
func StartStallProbe(tb TB) *StallProbe {
	return startStallProbe(tb, nil)
}

// startStallProbe is StartStallProbe with a betweenWakes hook.
//
// Each wake's lateness is measured from the wake before it, not from the
// start of its own sleep: the probe's goroutine can be kept from running
// between recording a wake and its next sleep too (preempted after the
// record's unlock, which may hand the mutex to a waiter and yield), and a
// stop of the process then was counted nowhere. Beside make test and
// yes > /dev/null x2, TestWaitForDerivesItsWindow saw a 69 ms stop
// widen its window by 3 × 95 µs.
func startStallProbe(tb TB, betweenWakes func()) *StallProbe {
	p := &StallProbe{stop: make(chan struct{}), done: make(chan struct{}), betweenWakes: betweenWakes}
	go func() {
		defer close(p.done)
		prev := time.Now()
		for range stallMaxWakes {
			select {
			case <-p.stop:
				return
			default:
			}
			time.Sleep(time.Millisecond)
			now := time.Now()
			p.mu.Lock()
			p.wakes = append(p.wakes, stallWake{at: now, late: max(0, now.Sub(prev)-time.Millisecond)})
			p.mu.Unlock()
			prev = now
			if p.betweenWakes != nil {
				p.betweenWakes()
			}
		}
	}()
	tb.Cleanup(p.Stop)
	return p
}

// Stop ends the probe and waits for its goroutine. Calling it again is
// harmless.
func (p *StallProbe) Stop() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// within calls f for every wake that came in [from, to]; the wake that
// ends a stall comes after it, so the first wake after to counts too.
func (p *StallProbe) within(from, to time.Time, f func(stallWake)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := sort.Search(len(p.wakes), func(i int) bool { return !p.wakes[i].at.Before(from) })
	for ; i < len(p.wakes); i++ {
		f(p.wakes[i])
		if p.wakes[i].at.After(to) {
			return
		}
	}
}

// Worst returns how late the probe ran at worst in [from, to].
func (p *StallProbe) Worst(from, to time.Time) time.Duration {
	var worst time.Duration
	p.within(from, to, func(w stallWake) { worst = max(worst, w.late) })
	return worst
}

// Stalled returns the sum of the probe's lateness in [from, to]: how long
// this process was kept from running its timers in that stretch.
func (p *StallProbe) Stalled(from, to time.Time) time.Duration {
	var sum time.Duration
	p.within(from, to, func(w stallWake) { sum += w.late })
	return sum
}

// Allowance is bound plus multiple times what the probe measured stalled
// in [from, to]: the window a timing assertion over that stretch allows.
func (p *StallProbe) Allowance(bound time.Duration, multiple int, from, to time.Time) time.Duration {
	return bound + time.Duration(multiple)*p.Stalled(from, to)
}

// Explain says how Allowance derived its window, for a failure message.
func (p *StallProbe) Explain(bound time.Duration, multiple int, from, to time.Time) string {
	return fmt.Sprintf("allowed %v = bound %v + %d × %v this process was measured stalled in that stretch (worst single stall %v)",
		p.Allowance(bound, multiple, from, to), bound, multiple, p.Stalled(from, to), p.Worst(from, to))
}

// Summary is the number of wakes and the worst lateness of all.
func (p *StallProbe) Summary() (wakes int, worst time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.wakes {
		worst = max(worst, w.late)
	}
	return len(p.wakes), worst
}
