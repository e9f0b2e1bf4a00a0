package renew_test

import (
	"sort"
	"sync"
	"time"
)

// schedProbe measures how late this process runs a timer: one goroutine
// sleeps a millisecond at a time and records every wake, when it came and
// how much later than asked. A lock's expiry timer is no more punctual
// than the probe's in the same stretch: a process the machine does not
// run (two busy cores, -race, other test binaries) runs neither, and the
// probe then sees the stall.
type schedProbe struct {
	mu    sync.Mutex
	wakes []probeWake // in order of their time
	stop  chan struct{}
	done  chan struct{}
}

type probeWake struct {
	at   time.Time     // when the probe ran again
	late time.Duration // how much later than its millisecond
}

// probeMaxWakes bounds the probe's record (and its loop): a wake a
// millisecond for well over a minute.
const probeMaxWakes = 200_000

// startSchedProbe starts a probe; Stop ends it.
func startSchedProbe() *schedProbe {
	p := &schedProbe{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for range probeMaxWakes {
			select {
			case <-p.stop:
				return
			default:
			}
			start := time.Now()
			time.Sleep(time.Millisecond)
			now := time.Now()
			p.mu.Lock()
			p.wakes = append(p.wakes, probeWake{at: now, late: now.Sub(start) - time.Millisecond})
			p.mu.Unlock()
		}
	}()
	return p
}

// Stop ends the probe and waits for its goroutine. Calling it again is
// harmless.
func (p *schedProbe) Stop() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// Worst returns how late the probe ran at worst in a wake that came in
// [from, to]: the wake that ended a stall comes after it, so a stall that
// covers from counts.
func (p *schedProbe) Worst(from, to time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := sort.Search(len(p.wakes), func(i int) bool { return !p.wakes[i].at.Before(from) })
	var worst time.Duration
	for ; i < len(p.wakes) && !p.wakes[i].at.After(to); i++ {
		worst = max(worst, p.wakes[i].late)
	}
	return worst
}

// Summary is the number of wakes and the worst lateness of all.
func (p *schedProbe) Summary() (wakes int, worst time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.wakes {
		worst = max(worst, w.late)
	}
	return len(p.wakes), worst
}
