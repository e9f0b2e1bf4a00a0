package sim

import (
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"
)

// inFlight is the seeds TestSim's workers are running, with when each
// began. A run whose goroutines wait on something synctest does not count
// as durably blocked (a sync.Mutex whose holder waits on the bubble's
// clock) never advances its virtual clock: maxRun never ends it, and
// TestSim would wait for it until go test's timeout, naming no seed.
// watch reports such a run instead.
type inFlight struct {
	mu    sync.Mutex
	began map[uint64]time.Time
}

func newInFlight() *inFlight { return &inFlight{began: map[uint64]time.Time{}} }

func (f *inFlight) start(seed uint64, at time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.began[seed] = at
}

func (f *inFlight) end(seed uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.began, seed)
}

// oldest returns the seed in flight the longest and when it began; ok is
// false when none is.
func (f *inFlight) oldest() (seed uint64, began time.Time, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s, b := range f.began {
		if !ok || b.Before(began) || (b.Equal(began) && s < seed) {
			seed, began, ok = s, b, true
		}
	}
	return seed, began, ok
}

// minHang is the least real time a seed runs before it counts as hung.
const minHang = time.Minute

// hangLimit is how long a seed may run, in real time, before it counts as
// hung: 1,000 times the real time a worker has spent per seed so far in
// this run (done seeds in elapsed on workers), and at least minHang, which
// also covers a run's first seeds. A seed costs milliseconds of CPU, and
// a machine that runs them slowly raises the mean with them.
func hangLimit(done int64, elapsed time.Duration, workers int) time.Duration {
	if done <= 0 {
		return minHang
	}
	return max(minHang, 1000*elapsed*time.Duration(workers)/time.Duration(done))
}

// hung reports the seed in flight past limit at now, if any, as the line
// to print: its scenario, how long it ran and its replay command.
func (f *inFlight) hung(now time.Time, limit time.Duration, scenario func(uint64) string) (string, bool) {
	seed, began, ok := f.oldest()
	if !ok || now.Sub(began) <= limit {
		return "", false
	}
	name := scenario(seed)
	return fmt.Sprintf("seed %d (%s) hung: in flight for %v of real time (limit %v), its virtual clock stopped; replay: %s",
		seed, name, now.Sub(began).Round(time.Second), limit.Round(time.Second), replayOf(name, seed)), true
}

// watch checks f every second until stop is closed. A hung seed is
// printed to out with every goroutine's stack, and then exit ends the
// process: the run's goroutines cannot be stopped.
func (f *inFlight) watch(stop <-chan struct{}, limit func() time.Duration, scenario func(uint64) string, out io.Writer, exit func()) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-tick.C:
			if line, ok := f.hung(now, limit(), scenario); ok {
				fmt.Fprintln(out, "--- FAIL: TestSim: "+line)
				buf := make([]byte, 8<<20)
				out.Write(buf[:runtime.Stack(buf, true)])
				fmt.Fprintln(out, line)
				exit()
				return
			}
		}
	}
}
