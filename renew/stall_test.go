package renew_test

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

// healthyLoss is healthyLossOn with no node measured: only this process's
// stalls excuse a loss.
func healthyLoss(p *redistest.StallProbe, lk *redlease.Lock) (ok bool, why string) {
	return healthyLossOn(p, nil, lk, nil, 0)
}

// healthyLossOn judges a kept lock on healthy nodes that was lost. It is a
// failure (ok false, why the figures) unless, in the stretch its last
// renewal had, this process was measured kept from running its timers, or
// the nodes its renewal needed were measured slow to answer a PING (nodes:
// the probe's addresses of those nodes; need: how many of them a renewal
// needs, 1 for a single master, the quorum for a quorum), for at least
// 1/stallMultiple of that stretch: a renewal needs the process to run and
// its nodes to answer, and one that did not get either for half the time
// it had is beyond what the package promises (its doc: starved for longer
// than the margin, a lock is lost). The nodes' slowness is the worst PING
// of the need-th fastest of them (each judged by its own worst PING in the
// stretch): a renewal that needs need nodes could not have done better.
// Excused losses are returned with ok true and the same figures, for the
// log.
func healthyLossOn(p *redistest.StallProbe, np *nodeProbe, lk *redlease.Lock, nodes []string, need int) (ok bool, why string) {
	from, to := renewalStretch(lk)
	stretch := to.Sub(from)
	stalled := p.Stalled(from, to)
	if np == nil {
		why = fmt.Sprintf("its last renewal had %v (from %s to %s); this process was measured stalled %v of it (worst single stall %v); excused only at %d × stall ≥ the stretch: %v",
			stretch.Round(time.Millisecond), from.Format("15:04:05.000"), to.Format("15:04:05.000"),
			stalled.Round(time.Millisecond), p.Worst(from, to).Round(time.Millisecond), stallMultiple, lk.Err())
		return time.Duration(stallMultiple)*stalled >= stretch, why
	}
	var worsts []time.Duration
	var pings []string
	for _, addr := range nodes {
		w, n := np.Worst(addr, from, to)
		worsts = append(worsts, w)
		pings = append(pings, fmt.Sprintf("%s: %d PINGs, worst %v", addr, n, w.Round(time.Millisecond)))
	}
	slices.Sort(worsts)
	var slow time.Duration
	if need >= 1 && need <= len(worsts) {
		slow = worsts[need-1] // the need-th fastest node's worst PING: a renewal could not do better
	}
	why = fmt.Sprintf("its last renewal had %v (from %s to %s); this process was measured stalled %v of it (worst single stall %v); its nodes' PINGs (%d of %d needed): %v, so %v slow; excused only at %d × stall or %d × slow ≥ the stretch: %v",
		stretch.Round(time.Millisecond), from.Format("15:04:05.000"), to.Format("15:04:05.000"),
		stalled.Round(time.Millisecond), p.Worst(from, to).Round(time.Millisecond), need, len(nodes), pings, slow.Round(time.Millisecond),
		stallMultiple, stallMultiple, lk.Err())
	return time.Duration(stallMultiple)*max(stalled, slow) >= stretch, why
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

// nodeProbe PINGs each node it watches every 20 ms, on a client of its own
// (no ContextTimeoutEnabled needed: it only records when each answer came),
// and keeps how long every PING took: what a renewal to that node got from
// the node (and this process) at that moment, measured in the same run. A
// node paused or black-holed by the test is not watched.
type nodeProbe struct {
	mu    sync.Mutex
	pings map[string][]nodePing // by address
	stop  chan struct{}
	wg    sync.WaitGroup
}

// nodePing is one PING: when it was sent and how long its answer took
// (took < 0: none came yet).
type nodePing struct {
	sent time.Time
	took time.Duration
}

// startNodeProbe watches addrs until the test ends.
func startNodeProbe(t *testing.T, addrs ...string) *nodeProbe {
	p := &nodeProbe{pings: map[string][]nodePing{}, stop: make(chan struct{})}
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		p.wg.Go(func() {
			defer func() { _ = c.Close() }()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-p.stop:
					return
				case <-tick.C:
				}
				sent := time.Now()
				p.mu.Lock()
				i := len(p.pings[addr])
				p.pings[addr] = append(p.pings[addr], nodePing{sent: sent, took: -1})
				p.mu.Unlock()
				err := c.Ping(context.Background()).Err()
				took := time.Since(sent)
				p.mu.Lock()
				p.pings[addr][i].took = took
				p.mu.Unlock()
				if err != nil {
					return // the node went away: nothing more to measure
				}
			}
		})
	}
	t.Cleanup(p.Stop)
	return p
}

// Stop ends the PINGs and waits for them (a PING in flight returns by the
// client's read timeout).
func (p *nodeProbe) Stop() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	p.wg.Wait()
}

// Worst is the longest any PING to addr that was waiting between from and
// to took (one still unanswered counts until now), and how many PINGs were
// sent to addr in that time.
func (p *nodeProbe) Worst(addr string, from, to time.Time) (worst time.Duration, sent int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	for _, pg := range p.pings[addr] {
		took := pg.took
		if took < 0 {
			took = now.Sub(pg.sent)
		}
		if pg.sent.After(to) || pg.sent.Add(took).Before(from) {
			continue
		}
		if !pg.sent.Before(from) && !pg.sent.After(to) {
			sent++
		}
		worst = max(worst, took)
	}
	return worst, sent
}
