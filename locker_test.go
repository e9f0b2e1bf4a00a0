package redlease_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/fused"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/single"
)

func TestTryLockHoldsAndExcludes(t *testing.T) {
	f := newFake()
	l, err := redlease.New(f, redlease.WithTTL(time.Minute))
	require.NoError(t, err)
	ctx := t.Context()

	lk, err := l.TryLock(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, "k", lk.Key())
	assert.Equal(t, uint64(1), lk.Fence())
	assert.Equal(t, time.Minute, lk.TTL())
	assert.True(t, lk.Valid())
	assert.True(t, lk.Until().After(time.Now()))
	assert.NoError(t, lk.Err())

	_, err = l.TryLock(ctx, "k")
	assert.ErrorIs(t, err, redlease.ErrNotObtained)

	require.NoError(t, lk.Release(ctx))
	assert.False(t, lk.Valid())
	assert.ErrorIs(t, lk.Release(ctx), redlease.ErrNotHeld, "a second release")
	assert.Equal(t, 1, f.releases, "a second release must not reach the strategy")
	select {
	case <-lk.Lost(): // a released lock is no longer this process's to use
	default:
		t.Fatal("Release must close Lost")
	}
	assert.NoError(t, lk.Err(), "a confirmed release is not a loss")
	assert.ErrorIs(t, lk.Extend(ctx, time.Minute), redlease.ErrNotHeld, "extend after release")
}

func TestTokensAre128RandomBits(t *testing.T) {
	f := newFake()
	l, err := redlease.New(f)
	require.NoError(t, err)
	seen := map[string]bool{}
	for i := range 100 {
		lk, err := l.TryLock(t.Context(), "k"+string(rune('a'+i%26))+string(rune('a'+i/26)))
		require.NoError(t, err)
		raw, err := base64.RawURLEncoding.DecodeString(lk.Token())
		require.NoError(t, err)
		assert.Len(t, raw, 16)
		assert.False(t, seen[lk.Token()], "token repeated")
		seen[lk.Token()] = true
	}
}

func TestLockRetriesWithATokenPerAttempt(t *testing.T) {
	f := newFake()
	f.failNext = []error{redlease.ErrNotObtained, redlease.ErrNotObtained, redlease.ErrNotObtained}
	l, err := redlease.New(f, redlease.WithRetryDelay(time.Millisecond, 2*time.Millisecond))
	require.NoError(t, err)
	lk, err := l.Lock(t.Context(), "k")
	require.NoError(t, err)
	require.Len(t, f.acquires, 4)
	seen := map[string]bool{}
	for _, tok := range f.acquires {
		assert.False(t, seen[tok], "attempts must not share a token: a failed attempt's late undo would match a later attempt's key")
		seen[tok] = true
	}
	assert.Equal(t, f.acquires[3], lk.Token(), "the lock carries the token of the attempt that got it")
}

func TestLockStopsAtMaxAttempts(t *testing.T) {
	f := newFake()
	l, err := redlease.New(f, redlease.WithRetryDelay(time.Millisecond, time.Millisecond))
	require.NoError(t, err)
	_, err = l.TryLock(t.Context(), "k")
	require.NoError(t, err)
	_, err = l.Lock(t.Context(), "k", redlease.WithMaxAttempts(3))
	assert.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.Len(t, f.acquires, 4, "one TryLock and three attempts")
}

func TestLockStopsPromptlyOnContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		l, err := redlease.New(f, redlease.WithRetryDelay(time.Second, time.Hour))
		require.NoError(t, err)
		_, err = l.TryLock(t.Context(), "k")
		require.NoError(t, err)

		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err = l.Lock(ctx, "k")
		assert.ErrorIs(t, err, redlease.ErrNotObtained)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, 100*time.Millisecond, time.Since(start), "Lock must return when ctx ends, not after its backoff")
	})
}

func TestLockDoesNotRetryOtherErrors(t *testing.T) {
	f := newFake()
	boom := errors.New("boom")
	f.failNext = []error{boom}
	locker, err := redlease.New(f)
	require.NoError(t, err)
	_, err = locker.Lock(t.Context(), "k")
	assert.ErrorIs(t, err, boom)
	assert.Len(t, f.acquires, 1)
}

func TestBadInputIsAnError(t *testing.T) {
	f := newFake()
	ctx := t.Context()
	// Construction: a bad strategy or default is New's error.
	for name, c := range map[string]struct {
		s    redlease.Strategy
		opts []redlease.Option
	}{
		"nil strategy":                 {nil, nil},
		"nil *single.Strategy":         {(*single.Strategy)(nil), nil},
		"negative ttl default":         {f, []redlease.Option{redlease.WithTTL(-time.Second)}},
		"nil default strategy":         {f, []redlease.Option{redlease.WithStrategy(nil)}},
		"zero retry delay default":     {f, []redlease.Option{redlease.WithRetryDelay(0, time.Second)}},
		"negative attempts default":    {f, []redlease.Option{redlease.WithMaxAttempts(-1)}},
		"margin not below ttl default": {f, []redlease.Option{redlease.WithTTL(time.Second), redlease.WithLossMargin(time.Second)}},
	} {
		l, err := redlease.New(c.s, c.opts...)
		assert.ErrorIs(t, err, redlease.ErrInvalid, "New: %s", name)
		assert.Nil(t, l, "New: %s", name)
	}
	// Calls: a bad key or per-call option is the call's error.
	l, err := redlease.New(f)
	require.NoError(t, err)
	cases := []struct {
		name   string
		locker *redlease.Locker
		key    string
		opts   []redlease.LockOption
	}{
		{"empty key", l, "", nil},
		{"zero ttl", l, "k", []redlease.LockOption{redlease.WithTTL(0)}},
		{"nil per-call strategy", l, "k", []redlease.LockOption{redlease.WithStrategy(nil)}},
		{"nil *single.Strategy per call", l, "k", []redlease.LockOption{redlease.WithStrategy((*single.Strategy)(nil))}},
		{"zero retry delay", l, "k", []redlease.LockOption{redlease.WithRetryDelay(0, time.Second)}},
		{"max below min", l, "k", []redlease.LockOption{redlease.WithRetryDelay(time.Second, time.Millisecond)}},
		{"negative attempts", l, "k", []redlease.LockOption{redlease.WithMaxAttempts(-1)}},
		{"margin not below the call's ttl", l, "k", []redlease.LockOption{redlease.WithTTL(time.Second), redlease.WithLossMargin(time.Second)}},
		{"nil locker", nil, "k", nil},
		{"fused script on a strategy that runs none", l, "k", []redlease.LockOption{fused.Option(unrunScript{}).(redlease.LockOption)}},
	}
	for _, c := range cases {
		_, err := c.locker.TryLock(ctx, c.key, c.opts...)
		assert.ErrorIs(t, err, redlease.ErrInvalid, "TryLock: %s", c.name)
		_, err = c.locker.Lock(ctx, c.key, c.opts...)
		assert.ErrorIs(t, err, redlease.ErrInvalid, "Lock: %s", c.name)
	}
	assert.Empty(t, f.acquires, "bad input must not reach the strategy")
}

// unrunScript is a fused script no strategy here runs (see internal/fused).
type unrunScript struct{ fused.Script }

func TestPerCallStrategyAndPrefix(t *testing.T) {
	cheap, careful := newFake(), newFake()
	l, err := redlease.New(cheap, redlease.WithPrefix("app:"))
	require.NoError(t, err)
	_, err = l.TryLock(t.Context(), "a")
	require.NoError(t, err)
	_, err = l.TryLock(t.Context(), "b", redlease.WithStrategy(careful))
	require.NoError(t, err)
	assert.Equal(t, []string{"app:a"}, cheap.keys)
	assert.Equal(t, []string{"app:b"}, careful.keys)
}

func TestLostClosesBeforeValidityRunsOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		locker, err := redlease.New(f, redlease.WithTTL(time.Second))
		require.NoError(t, err)
		lk, err := locker.TryLock(t.Context(), "k")
		require.NoError(t, err)
		until := lk.Until()
		<-lk.Lost()
		assert.Equal(t, until.Add(-100*time.Millisecond), time.Now(), "Lost closes a tenth of the TTL before Until by default")
		assert.False(t, lk.Valid())
		assert.ErrorIs(t, lk.Err(), redlease.ErrLost)
		assert.ErrorIs(t, lk.Extend(t.Context(), time.Second), redlease.ErrNotHeld, "a lost lock stays lost")

		locker2, err := redlease.New(f, redlease.WithTTL(time.Second), redlease.WithLossMargin(0))
		require.NoError(t, err)
		lk, err = locker2.TryLock(t.Context(), "k2")
		require.NoError(t, err)
		until = lk.Until()
		<-lk.Lost()
		assert.Equal(t, until, time.Now(), "with no margin, Lost closes at Until")
	})
}

func TestLossMarginMustBeShorterThanTTL(t *testing.T) {
	l, err := redlease.New(newFake(), redlease.WithTTL(time.Second))
	require.NoError(t, err)
	_, err = l.TryLock(t.Context(), "k", redlease.WithLossMargin(time.Second))
	assert.ErrorIs(t, err, redlease.ErrInvalid)
	_, err = l.TryLock(t.Context(), "k", redlease.WithLossMargin(-time.Millisecond))
	assert.ErrorIs(t, err, redlease.ErrInvalid)
}

func TestExtendMovesUntilAndPostponesLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		locker, err := redlease.New(f, redlease.WithTTL(time.Second))
		require.NoError(t, err)
		lk, err := locker.TryLock(t.Context(), "k")
		require.NoError(t, err)
		time.Sleep(800 * time.Millisecond)
		require.NoError(t, lk.Extend(t.Context(), time.Second))
		assert.Equal(t, time.Now().Add(time.Second), lk.Until())
		time.Sleep(500 * time.Millisecond) // past the first Until
		assert.True(t, lk.Valid())
		select {
		case <-lk.Lost():
			t.Fatal("Lost closed at the old Until")
		default:
		}
		require.NoError(t, lk.Release(t.Context()))
	})
}

func TestExtendVerdicts(t *testing.T) {
	f := newFake()
	l, err := redlease.New(f)
	require.NoError(t, err)
	ctx := t.Context()

	lk, err := l.TryLock(ctx, "k")
	require.NoError(t, err)
	f.failNext = []error{redlease.ErrUnavailable}
	assert.ErrorIs(t, lk.Extend(ctx, time.Minute), redlease.ErrUnavailable)
	assert.True(t, lk.Valid(), "an undecided extension must not mark the lock lost")

	f.failNext = []error{redlease.ErrNotHeld}
	assert.ErrorIs(t, lk.Extend(ctx, time.Minute), redlease.ErrNotHeld)
	<-lk.Lost()
	assert.ErrorIs(t, lk.Err(), redlease.ErrLost)
	assert.ErrorIs(t, lk.Err(), redlease.ErrNotHeld, "the cause stays reachable")
	assert.ErrorIs(t, lk.Extend(ctx, 0), redlease.ErrInvalid)
}

func TestNilLockIsSafe(t *testing.T) {
	var lk *redlease.Lock
	ctx := t.Context()
	assert.ErrorIs(t, lk.Release(ctx), redlease.ErrNotHeld)
	assert.ErrorIs(t, lk.Extend(ctx, time.Second), redlease.ErrNotHeld)
	assert.False(t, lk.Valid())
	assert.Empty(t, lk.Key())
	assert.Empty(t, lk.Token())
	assert.Zero(t, lk.Fence())
	assert.True(t, lk.Until().IsZero())
	<-lk.Lost()
}

func TestQuorumErrorUnwraps(t *testing.T) {
	cause := errors.New("connection refused")
	err := error(&redlease.QuorumError{
		Action: "acquire", Votes: 2, Quorum: 3, Nodes: 5, Err: redlease.ErrNotObtained,
		Causes: nil,
	})
	assert.ErrorIs(t, err, redlease.ErrNotObtained)
	var ne *redlease.NodeError
	assert.False(t, errors.As(err, &ne))

	qe := &redlease.QuorumError{Action: "acquire", Votes: 2, Quorum: 3, Nodes: 5, Err: redlease.ErrNotObtained}
	qe.Causes = append(qe.Causes, &redlease.NodeError{Node: 4, Addr: "127.0.0.1:1", Err: cause})
	err = qe
	require.ErrorAs(t, err, &ne)
	assert.Equal(t, 4, ne.Node)
	assert.ErrorIs(t, err, cause)
	assert.Contains(t, err.Error(), "2 of 5 nodes agreed, 3 needed")
	assert.Contains(t, err.Error(), "node 4 (127.0.0.1:1): connection refused")
}

// fastClock runs at twice real time.
type fastClock struct{ start time.Time }

func (c fastClock) Now() time.Time { return c.start.Add(2 * time.Since(c.start)) }

// A lock judges its validity by its Locker's clock: with a clock running
// at twice real speed it counts as lost after half the real time.
func TestLocksFollowTheInjectedClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := fastClock{start: time.Now()}
		f := newFake()
		locker, err := redlease.New(f, redlease.WithTTL(time.Second), redlease.WithLossMargin(0), redlease.WithClock(clock))
		require.NoError(t, err)
		lk, err := locker.TryLock(t.Context(), "k")
		require.NoError(t, err)
		// The fake strategy's Until is one real second away; the fast clock
		// reaches it in half a second.
		time.Sleep(499 * time.Millisecond)
		assert.True(t, lk.Valid())
		time.Sleep(2 * time.Millisecond)
		assert.False(t, lk.Valid(), "past Until by the lock's clock")
		assert.ErrorIs(t, lk.Err(), redlease.ErrLost)
		_, err = redlease.New(f, redlease.WithClock(nil))
		assert.ErrorIs(t, err, redlease.ErrInvalid)
	})
}

// Found by the simulator: the first call to Lost made after the lock's
// deadline had passed closed its channel twice (a panic) — once when it
// found the lock expired, once more because it was no longer held.
func TestLostFirstCalledAfterTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		locker, err := redlease.New(f, redlease.WithTTL(time.Second))
		require.NoError(t, err)
		lk, err := locker.TryLock(t.Context(), "k")
		require.NoError(t, err)
		time.Sleep(time.Until(lk.Until())) // past the deadline; Lost never called
		var lost <-chan struct{}
		require.NotPanics(t, func() { lost = lk.Lost() })
		select {
		case <-lost:
		default:
			t.Fatal("Lost is not closed past the deadline")
		}
		assert.ErrorIs(t, lk.Err(), redlease.ErrLost)
	})
}

// heldRenewals is the fake strategy, except that an Extend by the lock's
// own TTL (a keeper's renewal) waits for release before it answers.
type heldRenewals struct {
	*fake
	ttl     time.Duration
	entered chan struct{}
	release chan struct{}
}

func (h *heldRenewals) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	if ttl == h.ttl {
		h.entered <- struct{}{}
		<-h.release
	}
	return h.fake.Extend(ctx, key, token, ttl)
}

// A renewal (the lock's own TTL) and a Lock.Extend to a shorter TTL in
// flight together: a node may apply the Extend last, so the renewal's
// later answer must not move Until past the Extend's start plus its TTL.
// Forced order: the renewal is sent and held, Extend(2 s) completes, then
// the renewal answers with Until ten seconds on.
func TestRenewalDoesNotOutbidAShorterExtend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 10 * time.Second
		h := &heldRenewals{fake: newFake(), ttl: ttl, entered: make(chan struct{}), release: make(chan struct{})}
		locker, err := redlease.New(h, redlease.WithTTL(ttl))
		require.NoError(t, err)
		lk, err := locker.TryLock(t.Context(), "k")
		require.NoError(t, err)
		done := make(chan []error)
		go func() { done <- redlease.ExtendAll(t.Context(), []*redlease.Lock{lk}) }()
		<-h.entered // the renewal is on its way
		time.Sleep(time.Second)
		extendStart := time.Now()
		require.NoError(t, lk.Extend(t.Context(), 2*time.Second))
		close(h.release) // the renewal answers now, with Until 10 s from when it started
		require.NoError(t, (<-done)[0])
		assert.False(t, lk.Until().After(extendStart.Add(2*time.Second)),
			"Until %v after the Extend's start, whose 2 s TTL a node may have applied last", lk.Until().Sub(extendStart))
		// A renewal that starts after the Extend answered may move it
		// again, by the lock's TTL, which is now the Extend's.
		require.Equal(t, 2*time.Second, lk.TTL())
		time.Sleep(500 * time.Millisecond)
		renewalStart := time.Now()
		require.NoError(t, redlease.ExtendAll(t.Context(), []*redlease.Lock{lk})[0])
		assert.Equal(t, renewalStart.Add(2*time.Second), lk.Until(), "a later renewal extends it by the lock's TTL")
	})
}

// Do watches its lock's loss without a goroutine of its own: 10,000 Do
// calls at once (1,000 under the race detector, whose goroutines cost ten
// times the time), each inside fn, hold at most 100 goroutines beyond
// their callers' (the default watchdog's, go-redis's, the test's). Real
// redis-server, the single strategy, the default keeper, a client without
// ContextTimeoutEnabled: each call to Redis then runs in a goroutine that
// ends with its reply (internal/bounded), so the count is taken once
// those have ended, the callers all still inside fn.
func TestDoHoldsNoGoroutineOfItsOwn(t *testing.T) {
	const extra = 100
	calls := 10_000
	if raceEnabled {
		calls = 1_000
	}
	probe := redistest.StartStallProbe(t)
	l := newLocker(t, singleNode(t))
	ctx := t.Context()
	base := runtime.NumGoroutine()
	var callers sync.WaitGroup
	finish := make(chan struct{})
	entered := make(chan error, calls) // nil: inside fn; else Do's error
	errs := make(chan error, calls)
	for i := range calls {
		callers.Go(func() {
			err := l.Do(ctx, fmt.Sprintf("do-goroutines-%d", i), func(context.Context, *redlease.Lock) error {
				entered <- nil
				<-finish
				return nil
			})
			if err != nil {
				entered <- err
			}
			errs <- err
		})
	}
	defer func() {
		if t.Failed() {
			t.Logf("goroutines by creator: %v", goroutineCreators())
		}
		close(finish)
		callers.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		waitNoWatchGoroutines(t)
	}()
	for i := range calls {
		err := redistest.Await(t, probe, entered, time.Minute, 3, "%d of %d Do calls got their locks", i, calls)
		require.NoError(t, err, "Do")
	}
	held := 0
	probe.WaitFor(t, 5*time.Second, 3, 10*time.Millisecond, func() bool {
		held = runtime.NumGoroutine() - base - calls
		return held <= extra
	}, "%d Do calls inside fn hold more than %d goroutines beyond the callers'", calls, extra)
	t.Logf("%d Do calls inside fn: %d goroutines beyond the callers'", calls, held)
}

// goroutineCreators counts the process's goroutines by the function that
// created them ("created by" in their stacks).
func goroutineCreators() map[string]int {
	by := map[string]int{}
	for _, g := range goroutineStacks() {
		creator := "main"
		if _, after, ok := strings.Cut(g, "created by "); ok {
			creator, _, _ = strings.Cut(after, "\n")
			creator, _, _ = strings.Cut(creator, " in goroutine")
		}
		by[creator]++
	}
	return by
}

// keeper records what Do asks of it.
type keeper struct {
	mu      sync.Mutex
	kept    []*redlease.Lock
	stopped int
}

func (k *keeper) Keep(lk *redlease.Lock) func() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.kept = append(k.kept, lk)
	return func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		k.stopped++
	}
}

func TestDoHoldsWhileFnRunsAndReleasesAfter(t *testing.T) {
	f := newFake()
	k := &keeper{}
	l, err := redlease.New(f, redlease.WithKeeper(k))
	require.NoError(t, err)
	var fence uint64
	err = l.Do(t.Context(), "job", func(ctx context.Context, lk *redlease.Lock) error {
		fence = lk.Fence()
		assert.True(t, lk.Valid())
		_, err := l.TryLock(ctx, "job")
		assert.ErrorIs(t, err, redlease.ErrNotObtained, "the key is held while fn runs")
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, uint64(1), fence)
	assert.Empty(t, f.held, "released after fn")
	assert.Len(t, k.kept, 1)
	assert.Equal(t, 1, k.stopped, "renewal stopped")
}

func TestDoReturnsFnErrorAndStillReleases(t *testing.T) {
	f := newFake()
	boom := errors.New("boom")
	locker, err := redlease.New(f)
	require.NoError(t, err)
	err = locker.Do(t.Context(), "job", func(context.Context, *redlease.Lock) error { return boom })
	assert.ErrorIs(t, err, boom)
	assert.NotErrorIs(t, err, redlease.ErrLost)
	assert.Empty(t, f.held)
}

func TestDoReportsLossEvenWhenFnSucceeds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		var cause error
		locker, err := redlease.New(f, redlease.WithTTL(time.Second), redlease.WithoutKeeper())
		require.NoError(t, err)
		err = locker.Do(t.Context(), "job",
			func(ctx context.Context, lk *redlease.Lock) error {
				<-ctx.Done() // no keeper: the lock runs out, and fn hears of it
				cause = context.Cause(ctx)
				assert.True(t, time.Now().Before(lk.Until()), "fn is told before Until")
				return nil
			})
		assert.ErrorIs(t, err, redlease.ErrLost)
		assert.ErrorIs(t, cause, redlease.ErrLost)
	})
}

func TestDoReleasesOnPanic(t *testing.T) {
	f := newFake()
	assert.Panics(t, func() {
		locker, err := redlease.New(f)
		require.NoError(t, err)
		_ = locker.Do(t.Context(), "job", func(context.Context, *redlease.Lock) error { panic("boom") })
	})
	assert.Empty(t, f.held)
}

func TestDoDoesNotRunFnWithoutTheLock(t *testing.T) {
	f := newFake()
	l, err := redlease.New(f)
	require.NoError(t, err)
	lk, err := l.TryLock(t.Context(), "job")
	require.NoError(t, err)
	defer lk.Release(t.Context())
	ran := false
	err = l.Do(t.Context(), "job", func(context.Context, *redlease.Lock) error { ran = true; return nil },
		redlease.WithMaxAttempts(2), redlease.WithRetryDelay(time.Millisecond, time.Millisecond))
	assert.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.False(t, ran)
	assert.ErrorIs(t, l.Do(t.Context(), "job", nil), redlease.ErrInvalid)
}

// revokerFake tracks grants the way the failover strategy does.
type revokerFake struct {
	*fake
	mu      sync.Mutex
	revokes map[string]func(error)
}

func (r *revokerFake) Track(key, token string, revoke func(error)) func() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.revokes[token] = revoke
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(r.revokes, token)
	}
}

func (r *revokerFake) revokeAll(cause error) {
	r.mu.Lock()
	var fns []func(error)
	for _, f := range r.revokes {
		fns = append(fns, f)
	}
	r.mu.Unlock()
	for _, f := range fns {
		f(cause)
	}
}

func (r *revokerFake) tracked() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.revokes)
}

func TestRevokedGrantsAreLostAtOnce(t *testing.T) {
	r := &revokerFake{fake: newFake(), revokes: map[string]func(error){}}
	l, err := redlease.New(r)
	require.NoError(t, err)
	ctx := t.Context()
	a, err := l.TryLock(ctx, "a")
	require.NoError(t, err)
	b, err := l.TryLock(ctx, "b")
	require.NoError(t, err)
	assert.Equal(t, 2, r.tracked())

	require.NoError(t, b.Release(ctx))
	assert.Equal(t, 1, r.tracked(), "release untracks")

	failover := errors.New("primary failed over")
	r.revokeAll(failover)
	<-a.Lost()
	assert.ErrorIs(t, a.Err(), failover)
	assert.False(t, a.Valid())
	assert.Zero(t, r.tracked(), "a lost lock is untracked")
}
