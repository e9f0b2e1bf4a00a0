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

// holdLong runs one Do with fn longer than 3×ttl on l, and checks on the
// way that the lock stays held: fn's ctx is not cancelled, another locker
// is refused, Until moves. It returns once Do has.
func holdLong(t *testing.T, l, other *redlease.Locker, key string, ttl time.Duration, opts ...redlease.LockOption) {
	t.Helper()
	ctx := t.Context()
	var refused, checks int
	var firstUntil, lastUntil time.Time
	err := l.Do(ctx, key, func(ctx context.Context, lk *redlease.Lock) error {
		firstUntil = lk.Until()
		end := time.Now().Add(3*ttl + ttl/2)
		for time.Now().Before(end) {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(ttl / 4):
			}
			checks++
			if _, err := other.TryLock(ctx, key); assert.ErrorIs(t, err, redlease.ErrNotObtained, "the key is held while fn runs") {
				refused++
			}
		}
		lastUntil = lk.Until()
		assert.NoError(t, ctx.Err(), "fn's ctx is not cancelled")
		assert.True(t, lk.Valid())
		return nil
	}, opts...)
	require.NoError(t, err, "Do keeps its lock past 3×TTL without any option")
	assert.Equal(t, checks, refused)
	assert.Greater(t, lastUntil.Sub(firstUntil), 2*ttl, "the lock was extended several times")

	lk, err := other.TryLock(ctx, key)
	require.NoError(t, err, "released after Do")
	require.NoError(t, lk.Release(ctx))
}

// Do with no option renews its lock: a function three and a half TTLs long
// keeps it from start to end, and the key is free after. The default
// watchdog's goroutines exist while it runs and are gone once Do returned,
// and a later Do starts them again.
func TestDoKeepsLockByDefault(t *testing.T) {
	s := singleNode(t)
	const ttl = time.Second
	l, err := redlease.New(s, redlease.WithTTL(ttl))
	require.NoError(t, err)
	other, err := redlease.New(s, redlease.WithTTL(ttl))
	require.NoError(t, err)
	waitNoWatchGoroutines(t) // a Do of an earlier test may still be ending
	baseline := goleak.IgnoreCurrent()

	for round := range 2 { // the second round restarts the idle watchdog
		var during int
		var wg sync.WaitGroup
		stop := make(chan struct{})
		wg.Go(func() {
			for {
				during = max(during, watchGoroutines())
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
		})
		holdLong(t, l, other, t.Name(), ttl)
		close(stop)
		wg.Wait()
		assert.Positive(t, during, "round %d: the default watchdog ran", round)
		goleak.VerifyNone(t, baseline)
		assert.Zero(t, watchGoroutines(), "round %d", round)
	}
}

// WithoutKeeper keeps the former behaviour: nothing renews the lock, and
// fn's ctx is cancelled at the loss margin, before Until, with ErrLost.
func TestDoWithoutKeeperLosesAtLossMargin(t *testing.T) {
	s := singleNode(t)
	const ttl = time.Second
	w, err := renew.New()
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	for name, l := range map[string]struct {
		locker *redlease.Locker
		opts   []redlease.LockOption
	}{
		"locker":                       {newLocker(t, s, redlease.WithTTL(ttl), redlease.WithoutKeeper()), nil},
		"call":                         {newLocker(t, s, redlease.WithTTL(ttl)), []redlease.LockOption{redlease.WithoutKeeper()}},
		"call on a locker with keeper": {newLocker(t, s, redlease.WithTTL(ttl), redlease.WithKeeper(w)), []redlease.LockOption{redlease.WithoutKeeper()}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var start, lostAt, until time.Time
			var cause error
			probe := redistest.StartStallProbe(t)
			err := l.locker.Do(t.Context(), t.Name(), func(ctx context.Context, lk *redlease.Lock) error {
				start, until = time.Now(), lk.Until()
				soft := &redistest.SoftTB{TB: t}
				redistest.Await(soft, probe, ctx.Done(), 3*ttl, 3, "fn's ctx was not cancelled")
				if soft.Failed() != "" {
					t.Error(soft.Failed())
				}
				lostAt, cause = time.Now(), context.Cause(ctx)
				assert.Zero(t, w.Len(), "the locker's keeper is not used")
				return nil
			}, l.opts...)
			require.ErrorIs(t, err, redlease.ErrLost)
			assert.ErrorIs(t, cause, redlease.ErrLost)
			margin := ttl / redlease.DefaultLossMarginDivisor
			assert.False(t, lostAt.Before(until.Add(-margin)), "not cancelled before the loss margin")
			// Due at the loss margin: before Until and within the first TTL,
			// plus 3 × what this process was measured stalled (a starved
			// process runs the timer late: Lost's doc).
			due := until.Add(-margin)
			if ok, why := probe.Within(lostAt.Sub(due), margin, 3, due); !ok {
				assert.Fail(t, "outside the window derived from this run", "cancelled before Until: %s", why)
			}
			if ok, why := probe.Within(lostAt.Sub(start), ttl, 3, start); !ok {
				assert.Fail(t, "outside the window derived from this run", "within the first TTL: %s", why)
			}
		})
	}
}

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
