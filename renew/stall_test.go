package renew_test

import (
	"flag"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/renew"
)

// full runs the tests whose size is their point at that size: 10,000
// locks in TestWatchdogKeepsTenThousandLocks, 8 s of starvation per
// strategy in TestStarvedProcessKeepsHealthyLocks. Without it they run
// smaller (same checks, fewer locks or renewals) to fit `make test`:
//
//	go test -race -count=1 -run 'TenThousand|Starved' ./renew/ -renew.full
var full = flag.Bool("renew.full", false, "run the size-is-the-point tests at full size (10,000 locks, 8 s of starvation); make chaos runs them so")

// stallMultiple is the multiple of this process's measured stall that a
// timing assertion in this package allows on top of its promised bound
// (redistest.StallProbe.Allowance): a timer that fires late by the stall,
// and the goroutines it wakes that wait as long again for a processor.
const stallMultiple = 2

// closeBound is what Close promises with a call in flight on a hung node:
// it returns within one renewal timeout.
const closeBound = renew.DefaultTimeout

// assertClosedInTime checks that a Close that started at start and took
// took kept its promise (one renewal timeout), plus stallMultiple times
// what the probe measured this process stalled meanwhile.
func assertClosedInTime(t *testing.T, p *redistest.StallProbe, start time.Time, took time.Duration) {
	t.Helper()
	if ok, why := p.Within(took, closeBound, stallMultiple, start); !ok {
		assert.Fail(t, "Close must return within one renewal timeout", why)
	}
}

// renewalStretch is the time a kept lock's last renewal had: from when it
// fell due (DefaultFraction of its TTL after the grant or extension that
// set its Until) to its deadline (Until less the loss margin). A lost lock
// keeps the Until of its last success, so this is the stretch in which the
// renewal that never came should have.
func renewalStretch(lk *redlease.Lock) (from, to time.Time) {
	ttl := lk.TTL()
	return lk.Until().Add(-ttl + time.Duration(renew.DefaultFraction*float64(ttl))), lk.Deadline()
}

// healthyLoss judges a kept lock on healthy nodes that was lost. It is a
// failure (ok false, why the figures) unless the probe measured this
// process kept from running its timers, in the stretch its last renewal
// had, for at least 1/stallMultiple of that stretch: a renewal needs the
// process to run, and one that did not run for half the time it had is
// beyond what the package promises (its doc: starved for longer than the
// margin, a lock is lost). Excused losses are returned with ok true and
// the same figures, for the log.
func healthyLoss(p *redistest.StallProbe, lk *redlease.Lock) (ok bool, why string) {
	from, to := renewalStretch(lk)
	stretch := to.Sub(from)
	stalled := p.Stalled(from, to)
	why = fmt.Sprintf("its last renewal had %v (from %s to %s); this process was measured stalled %v of it (worst single stall %v); excused only at %d × stall ≥ the stretch: %v",
		stretch.Round(time.Millisecond), from.Format("15:04:05.000"), to.Format("15:04:05.000"),
		stalled.Round(time.Millisecond), p.Worst(from, to).Round(time.Millisecond), stallMultiple, lk.Err())
	return time.Duration(stallMultiple)*stalled >= stretch, why
}

// assertLostBeforeUntil checks that a lock reported lost at at was
// reported before its Until. Lost closes from a timer set for the lock's
// deadline, a loss margin before Until: it can close after Until only if
// this process could not run a timer for longer than that (the documented
// limit). That is excused only when the probe measured a single stall at
// least as long as the overrun between the deadline and the report.
func assertLostBeforeUntil(t *testing.T, p *redistest.StallProbe, lk *redlease.Lock, at time.Time) {
	t.Helper()
	over := at.Sub(lk.Until())
	if over < 0 {
		return
	}
	stall := p.Worst(lk.Deadline(), at)
	if stall < over {
		t.Errorf("lock %s reported lost %v after its Until, while this process's timers were at most %v late between its deadline and then (an overrun is excused only by a single stall at least as long): %v",
			lk.Key(), over, stall, lk.Err())
		return
	}
	t.Logf("lock %s reported lost %v after its Until, during a measured stall of %v (the documented limit)", lk.Key(), over, stall)
}

// waitLost waits for lk to be reported lost: by its Until, or later by
// stallMultiple times what the probe measured this process stalled since
// from. It returns when Lost closed, and false if it did not in that time.
func waitLost(t *testing.T, p *redistest.StallProbe, lk *redlease.Lock, from time.Time) (time.Time, bool) {
	t.Helper()
	bound := lk.Until().Sub(from)
	for range 1000 { // each round waits at least 10 ms
		wait := from.Add(p.Allowance(bound, stallMultiple, from, time.Now())).Sub(time.Now())
		if wait <= 0 {
			t.Errorf("lock %s not reported lost %v after %s: %s", lk.Key(), time.Since(from).Round(time.Millisecond),
				from.Format("15:04:05.000"), p.Explain(bound, stallMultiple, from, time.Now()))
			return time.Time{}, false
		}
		select {
		case <-lk.Lost():
			return time.Now(), true
		case <-time.After(max(wait, 10*time.Millisecond)):
		}
	}
	t.Errorf("lock %s not reported lost after 1000 rounds of waiting", lk.Key())
	return time.Time{}, false
}
