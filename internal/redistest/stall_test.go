package redistest

import (
	"fmt"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestStallProbeSeesAStarvedProcess stops the world (what a machine that
// does not run the process looks like to it) and checks the probe counts
// the stop in the stretch that covers it, and not in one before it. No
// check has a real-time window: a stop of 60 ms makes a wake at least
// 40 ms late however busy the machine is (it can only be later), and the
// stretch before the stop is compared with itself, measured before the
// stop and after it, so what the machine did in it does not matter.
func TestStallProbeSeesAStarvedProcess(t *testing.T) {
	p := StartStallProbe(t)
	time.Sleep(20 * time.Millisecond)
	before := time.Now()
	p.settle(before) // the wake after before, which counts in its stretch, is recorded
	stalledBefore := p.Stalled(time.Time{}, before)
	start := time.Now()
	stopTheWorldFor(t, 60*time.Millisecond)
	end := time.Now()
	time.Sleep(10 * time.Millisecond)
	p.Stop()

	wakes, worst := p.Summary()
	require.Greater(t, wakes, 0, "the probe woke")
	require.GreaterOrEqual(t, worst, 40*time.Millisecond, "the probe saw the stop")
	require.GreaterOrEqual(t, p.Stalled(start, end), 40*time.Millisecond)
	require.GreaterOrEqual(t, p.Allowance(time.Second, 2, start, end), time.Second+80*time.Millisecond)
	require.Contains(t, p.Explain(time.Second, 2, start, end), "measured stalled")
	require.Equal(t, stalledBefore, p.Stalled(time.Time{}, before), "a stretch before the stop does not count it")
}

// A stop of the process while the probe's goroutine is between two wakes
// (one recorded, its next sleep not begun) counts in the stretch that
// covers it, as a stop during a sleep does. Forced order: the probe's own
// goroutine has the process stopped from that point. Exact: the wake after
// the stop is late by at least the time from before the stop to after it.
func TestStallProbeCountsAStopBetweenItsWakes(t *testing.T) {
	type stop struct {
		from, to time.Time
		err      error
	}
	var armed atomic.Bool
	stopped := make(chan stop, 1)
	p := startStallProbe(t, func() {
		if !armed.CompareAndSwap(true, false) {
			return
		}
		from := time.Now()
		err := exec.Command("sh", "-c", "kill -STOP $PPID; sleep 0.060; kill -CONT $PPID").Run()
		stopped <- stop{from, time.Now(), err}
	})
	armed.Store(true)
	var s stop
	select {
	case s = <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the probe never ran its hook")
	}
	require.NoError(t, s.err)
	p.settle(s.to)
	require.GreaterOrEqual(t, p.Stalled(s.from, s.to), s.to.Sub(s.from),
		"a stop between the probe's wakes counts: %s", p.Explain(0, 1, s.from, s.to))
}

// stopTheWorldFor has a child shell stop this process with SIGSTOP and
// continue it d later, as a machine that does not run it would.
func stopTheWorldFor(t *testing.T, d time.Duration) {
	t.Helper()
	cmd := exec.Command("sh", "-c", fmt.Sprintf("kill -STOP $PPID; sleep %.3f; kill -CONT $PPID", d.Seconds()))
	require.NoError(t, cmd.Run())
}

// recTB is a TB that records Fatalf instead of ending the test.
type recTB struct {
	testing.TB
	fatal string
}

func (r *recTB) Helper() {}
func (r *recTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
}

// WaitFor returns once its condition holds, and fails, saying how its
// window was derived, when the condition does not hold within it; a stop
// of the process inside the wait widens the window.
func TestWaitForDerivesItsWindow(t *testing.T) {
	p := StartStallProbe(t)
	polls := 0
	rec := &recTB{TB: t}
	p.WaitFor(rec, time.Second, 3, time.Millisecond, func() bool { polls++; return polls == 3 }, "third poll")
	require.Empty(t, rec.fatal)
	require.Equal(t, 3, polls, "polled until the condition held")

	start := time.Now()
	p.WaitFor(rec, 30*time.Millisecond, 3, time.Millisecond, func() bool { return false }, "never %s", "true")
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "waited the bound")
	require.Contains(t, rec.fatal, "never true: not within")
	require.Contains(t, rec.fatal, "measured stalled", "the message says how the window was derived")

	rec.fatal = ""
	var stopped time.Duration
	start = time.Now()
	p.WaitFor(rec, 30*time.Millisecond, 3, time.Millisecond, func() bool {
		if stopped == 0 {
			t0 := time.Now()
			stopTheWorldFor(t, 60*time.Millisecond)
			stopped = time.Since(t0)
		}
		return false
	}, "never")
	require.NotEmpty(t, rec.fatal)
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond+3*40*time.Millisecond, "a stop of %v inside the wait widened its window: %s", stopped, rec.fatal)
}

// Within compares a duration with the window derived from the same
// stretch, and says so.
func TestWithinComparesWithTheDerivedWindow(t *testing.T) {
	p := StartStallProbe(t)
	start := time.Now()
	time.Sleep(5 * time.Millisecond)
	ok, why := p.Within(time.Since(start), time.Second, 3, start)
	require.True(t, ok, why)
	require.Contains(t, why, "measured stalled")
	start = time.Now()
	time.Sleep(20 * time.Millisecond)
	took := time.Since(start)
	ok, why = p.Within(took, time.Millisecond, 0, start)
	require.False(t, ok, "%v is past a 1 ms bound with no allowance for stalls: %s", took, why)
	require.Contains(t, why, "took ")
}

// Await returns what arrives on its channel, the zero value once the
// channel is closed, and fails, saying how its window was derived, when
// nothing arrives within it; a stop of the process inside the wait widens
// the window by the multiple times the stop.
func TestAwaitDerivesItsWindow(t *testing.T) {
	p := StartStallProbe(t)
	rec := &recTB{TB: t}
	values := make(chan int, 1)
	values <- 7
	require.Equal(t, 7, Await(rec, p, values, time.Second, 3, "a value"))
	closed := make(chan struct{})
	close(closed)
	Await(rec, p, closed, time.Second, 3, "a closed channel")
	require.Empty(t, rec.fatal)

	never := make(chan struct{})
	start := time.Now()
	Await(rec, p, never, 30*time.Millisecond, 3, "never %s", "closed")
	require.GreaterOrEqual(t, time.Since(start), 30*time.Millisecond, "waited the bound")
	require.Contains(t, rec.fatal, "never closed: not within")
	require.Contains(t, rec.fatal, "measured stalled", "the message says how the window was derived")

	rec.fatal = ""
	stopped := make(chan error, 1)
	start = time.Now()
	go func() {
		time.Sleep(5 * time.Millisecond)
		stopped <- exec.Command("sh", "-c", "kill -STOP $PPID; sleep 0.060; kill -CONT $PPID").Run()
	}()
	Await(rec, p, never, time.Second, 3, "never") // the stop begins well inside the second
	took := time.Since(start)
	require.NoError(t, <-stopped)
	require.NotEmpty(t, rec.fatal)
	require.GreaterOrEqual(t, took, time.Second+3*40*time.Millisecond, "a stop inside the wait widened its window: %s", rec.fatal)
}

// A SoftTB keeps a failed wait's message instead of ending the goroutine,
// and a Lazy part of the message is computed when the message is written.
func TestSoftTBKeepsTheFailureAndLazyIsComputedLate(t *testing.T) {
	p := StartStallProbe(t)
	soft := &SoftTB{TB: t}
	state := "before"
	Await(soft, p, make(chan struct{}), time.Millisecond, 0, "never: %s", Lazy(func() string { return state }))
	require.Contains(t, soft.Failed(), "never: before")
	state = "at the start"
	p.WaitFor(soft, time.Millisecond, 0, time.Millisecond, func() bool { state = "at the failure"; return false }, "never: %s", Lazy(func() string { return state }))
	require.Contains(t, soft.Failed(), "never: at the failure", "the state when the wait failed, not when it began")
}
