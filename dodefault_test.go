package redlease_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/renew"
)

// The default watchdog's goroutines do not grow with the number of Do
// calls: 200 at once on one strategy, all renewed, cost the scheduler and
// at most renew.DefaultMaxCalls renewal calls.
//
// The test's goroutine samples the watchdog's goroutines and, between
// samples, looks at every lock (the functions only wait, so no goroutine of
// theirs is ever caught inside a Lock method): a lock is renewed once its
// Until moved a quarter TTL past its first, which the window
// Allowance(ttl, 3) of the same run must see. A lock lost instead (its
// validity, less the loss margin, ran out before a renewal landed) counts
// as the machine's doing only when 3 × the longest single stall the probe
// measured over its wait covers the room its renewal had (validity less
// margin less one renewal interval): then it is reported in the log and
// not held against the watchdog; any other loss fails (a sum of stalls
// would not do: a loaded machine runs the probe late by a fraction of
// every millisecond, which adds up to most of the room without ever
// stopping the process). At least one lock must have been renewed.
func TestDefaultWatchdogGoroutinesAreConstant(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	s := singleNode(t)
	const (
		n   = 200
		ttl = 2 * time.Second
		// room is how long a renewal may be late before the lock is lost:
		// the loss margin and one renewal interval (a third of the TTL)
		// off the TTL.
		room = ttl - ttl/redlease.DefaultLossMarginDivisor - ttl/3
	)
	l, err := redlease.New(s, redlease.WithTTL(ttl))
	require.NoError(t, err)
	waitNoWatchGoroutines(t)
	baseline := goleak.IgnoreCurrent()

	ctx := t.Context()
	type held struct {
		lk    *redlease.Lock
		first time.Time  // its Until when fn began
		began time.Time  // when fn began: its renewals are due from then
		lost  chan error // the cause, once fn's ctx ended
		err   error      // what Do returned
	}
	locks := make([]held, n)
	var started, wg sync.WaitGroup
	started.Add(n)
	done := make(chan struct{}) // every lock has its outcome: the functions return
	for i := range n {
		locks[i].lost = make(chan error, 1)
		wg.Go(func() {
			locks[i].err = l.Do(ctx, fmt.Sprintf("%s:%d", t.Name(), i), func(ctx context.Context, lk *redlease.Lock) error {
				locks[i].lk, locks[i].first, locks[i].began = lk, lk.Until(), time.Now()
				started.Done()
				select {
				case <-done:
				case <-ctx.Done():
					locks[i].lost <- context.Cause(ctx)
					<-done
				}
				return nil
			})
		})
	}
	started.Wait()
	from := time.Now()
	// Goroutines of the watchdog, and those of them inside a renewal call
	// (below the engine, in the strategy or go-redis), sampled until every
	// lock has its outcome. A call's goroutine lives on for a moment after
	// its slot was given back (it hands its outcome to the scheduler,
	// which may start the next call at once, then takes the engine's mutex
	// to leave): the bound on calls is exact, the one on goroutines allows
	// one leaving per slot.
	most, mostInCall, samples := 0, 0, 0
	var mostStacks []string
	const (
		pending = iota
		renewedOutcome
		lostOutcome
		lateOutcome
	)
	outcome := make([]int, n)
	lostAt := make([]time.Time, n)
	lostCause := make([]error, n)
	left := n
	for ; left > 0 && samples < 100_000; samples++ {
		nw, st := watchStacks()
		inCall := 0
		for _, g := range st {
			if strings.Contains(g, "github.com/redlease/redlease/single.") || strings.Contains(g, "github.com/redlease/redlease/internal/primary.") ||
				strings.Contains(g, "github.com/redis/go-redis/") {
				inCall++
			}
		}
		mostInCall = max(mostInCall, inCall)
		if nw > most {
			most, mostStacks = nw, st
		}
		now := time.Now()
		late := now.Sub(from) > probe.Allowance(ttl, 3, from, now)
		for i := range locks {
			if outcome[i] != pending {
				continue
			}
			select {
			case lostCause[i] = <-locks[i].lost:
				outcome[i], lostAt[i] = lostOutcome, now
			default:
				switch {
				case locks[i].lk.Until().After(locks[i].first.Add(ttl / 4)):
					outcome[i] = renewedOutcome
				case late:
					outcome[i] = lateOutcome
				}
			}
			if outcome[i] != pending {
				left--
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
	end := time.Now()
	close(done)
	wg.Wait()
	renewed, excused := 0, 0
	for i, h := range locks {
		key := h.lk.Key()
		switch outcome[i] {
		case renewedOutcome:
			renewed++
			require.NoError(t, h.err, key)
		case lostOutcome:
			// Judged from when this lock's fn began (not from when the
			// last of the n did), against the window derived from this
			// run: the renewal's room plus 3 × what the probe measured
			// this process stalled since then. Two make tests at once
			// (load 15-30) stalled it 1.9 s of 2 s in stalls of under
			// 100 ms each, which a test of the single longest stall did
			// not excuse. On a quiet machine the window is about the room,
			// and a watchdog that does not renew is caught.
			lostAfter := lostAt[i].Sub(h.began)
			if allowed := probe.Allowance(room, 3, h.began, lostAt[i]); lostAfter <= allowed {
				excused++
				t.Logf("%s lost %v after its fn began, within the window derived from this run (%s): the machine's doing, not counted: %v",
					key, lostAfter.Round(time.Millisecond), probe.Explain(room, 3, h.began, lostAt[i]), lostCause[i])
				continue
			}
			t.Errorf("%s lost %v after its fn began, past the window derived from this run (%s): %v",
				key, lostAfter.Round(time.Millisecond), probe.Explain(room, 3, h.began, lostAt[i]), lostCause[i])
		default:
			t.Errorf("%s not renewed: %s", key, probe.Explain(ttl, 3, from, end))
		}
	}
	t.Logf("%d locks renewed, %d lost to a measured stall, in %d samples", renewed, excused, samples)
	require.Positive(t, renewed, "at least one lock was renewed (the check examined something)")
	assert.Positive(t, most, "the default watchdog ran")
	t.Logf("at most %d watchdog goroutines, %d of them in a renewal call", most, mostInCall)
	assert.LessOrEqual(t, mostInCall, renew.DefaultMaxCalls, "at most DefaultMaxCalls renewal calls at once, for %d Do calls", n)
	if !assert.LessOrEqual(t, most, 1+2*renew.DefaultMaxCalls, "one scheduler, DefaultMaxCalls calls and one leaving call per slot, for %d Do calls", n) {
		t.Logf("the watchdog's goroutines:\n%s", strings.Join(mostStacks, "\n\n"))
	}
	goleak.VerifyNone(t, baseline)
}

// Contradictory keeper options are refused by New with ErrInvalid, never a
// panic.
func TestDoKeeperOptionsInvalid(t *testing.T) {
	f := newFake()
	k := &keeper{}
	for name, opts := range map[string][]redlease.Option{
		"keeper then without": {redlease.WithKeeper(k), redlease.WithoutKeeper()},
		"without then keeper": {redlease.WithoutKeeper(), redlease.WithKeeper(k)},
		"nil keeper":          {redlease.WithKeeper(nil)},
	} {
		l, err := redlease.New(f, opts...)
		assert.ErrorIs(t, err, redlease.ErrInvalid, name)
		assert.Nil(t, l, name)
	}
	assert.Empty(t, k.kept)

	// WithoutKeeper on a call to TryLock is accepted and changes nothing.
	locker, err := redlease.New(f)
	require.NoError(t, err)
	lk, err := locker.TryLock(t.Context(), "k", redlease.WithoutKeeper())
	require.NoError(t, err)
	require.NoError(t, lk.Release(t.Context()))
}
