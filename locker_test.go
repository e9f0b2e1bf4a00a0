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

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/fused"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/renew"
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

func TestLossMarginMustBeShorterThanTTL(t *testing.T) {
	l, err := redlease.New(newFake(), redlease.WithTTL(time.Second))
	require.NoError(t, err)
	_, err = l.TryLock(t.Context(), "k", redlease.WithLossMargin(time.Second))
	assert.ErrorIs(t, err, redlease.ErrInvalid)
	_, err = l.TryLock(t.Context(), "k", redlease.WithLossMargin(-time.Millisecond))
	assert.ErrorIs(t, err, redlease.ErrInvalid)
}

// Lock's attempts have tokens of their own (so that a failed attempt's late
// undo cannot delete a key a later attempt counts), but they are attempts
// of one acquisition: a key that an earlier attempt wrote, whose reply was
// lost and whose undo has not landed, is taken over by the next attempt at
// once instead of blocking the key until its TTL. Forced order: attempt 1's
// write is applied and its reply held (the client gives up), its undo is
// held, attempt 2 is applied, then the stale undo lands and must not touch
// attempt 2's key.
func TestLockTakesOverItsOwnEarlierAttemptsKey(t *testing.T) {
	ctx := t.Context()
	srv := redistest.Start(t, redistest.Config{})
	loadScripts(t, srv.Client())
	gate := redistest.NewGate(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: gate.Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.Ping(ctx).Err())
	const key = "attempts:takeover"
	l := singleLocker(t, c, redlease.WithTTL(20*time.Second), redlease.WithRetryDelay(time.Millisecond, time.Millisecond))

	acquireSHA, releaseSHA := script.Acquire.Hash(), script.Release.Hash()
	gate.HoldRequests(key)
	gate.HoldReplies(acquireSHA)
	probe := redistest.StartStallProbe(t)
	got := lockAsync(ctx, l, key) // its Lock is bounded at 30 s

	// Attempt 1 is applied; its reply is held, so the client times out and
	// sends its undo, which is held too.
	require.NoError(t, gate.WaitHeld(1, acquireSHA, 5*time.Second))
	require.NoError(t, gate.Step(acquireSHA, 5*time.Second))
	require.NoError(t, gate.WaitHeld(1, releaseSHA, 5*time.Second))
	first, err := srv.Client().Get(ctx, key).Result()
	require.NoError(t, err, "attempt 1 wrote the key")
	// Attempt 2 comes (the undo timed out in the client); its reply flows.
	// A reply that still misses the client's 200 ms read timeout (at load
	// 25-33 one did) costs one more attempt, which the gate holds too:
	// step each until one is answered in time, at most maxAttempts.
	gate.HoldReplies("")
	const maxAttempts = 20
	var r lockResult
	for attempt := 2; ; attempt++ {
		require.LessOrEqual(t, attempt, maxAttempts, "attempts whose replies missed the read timeout")
		require.NoError(t, gate.WaitHeld(1, acquireSHA, 5*time.Second))
		require.NoError(t, gate.Step(acquireSHA, 5*time.Second))
		answered := false
		probe.WaitFor(t, 5*time.Second, 3, time.Millisecond, func() bool {
			select {
			case r = <-got:
				answered = true
				return true
			default:
				return gate.HeldContaining(acquireSHA) > 0
			}
		}, "attempt %d neither returned nor was followed by another", attempt)
		if answered {
			t.Logf("attempt %d answered within the read timeout", attempt)
			break
		}
	}
	require.NoError(t, r.err, "the next attempt must take over its own earlier attempt's key, not wait for its TTL")
	require.NotEqual(t, first, r.lk.Token(), "attempts have tokens of their own")

	// The stale undo of attempt 1 lands: the last attempt's key stays.
	require.NoError(t, gate.Step(releaseSHA, 5*time.Second))
	gate.Open()
	held, err := srv.Client().Get(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, r.lk.Token(), held, "a stale undo removed the new attempt's key")
	require.True(t, r.lk.Valid())
	locker := singleLocker(t, srv.Client())
	b, err := locker.TryLock(ctx, key)
	if err == nil {
		t.Fatalf("double grant: B got the lock (fence %d) while A holds it", b.Fence())
	}
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	require.NoError(t, r.lk.Release(ctx))
}

// Lock's wait ends (its ctx) while an attempt is on its way: the nodes'
// last answer was "held", and that is what Lock reports (with the ctx's
// cause), not "unavailable" — the CLI maps the two to different exit
// codes (75 and 69), and a key held by another is not a node down
// (TestExitCodes/75_held_by_another failed so once in a clean-clone CI).
// Forced order: the waiter's second acquisition is held in a gate until
// its ctx has ended.
func TestLockWaitEndingMidAttemptSaysHeld(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	gate := redistest.NewGate(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: gate.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	locker := singleLocker(t, srv.Client(), redlease.WithTTL(30*time.Second))
	holder, err := locker.TryLock(ctx, "busy")
	require.NoError(t, err)
	l := singleLocker(t, c, redlease.WithTTL(30*time.Second), redlease.WithPolling())
	warm, err := l.TryLock(ctx, "warm-up") // scripts loaded, a connection open
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))

	gate.HoldRequests("busy")
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := l.Lock(wctx, "busy", redlease.WithRetryDelay(10*time.Millisecond, 10*time.Millisecond))
		got <- err
	}()
	require.NoError(t, gate.WaitHeld(1, "busy", 5*time.Second))
	require.NoError(t, gate.Step("busy", 5*time.Second)) // the first attempt: refused
	require.NoError(t, gate.WaitHeld(1, "busy", 5*time.Second))
	err = <-got // the second attempt is still held when the wait ends
	gate.Open()
	t.Logf("Lock: %v", err)
	assert.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotErrorIs(t, err, redlease.ErrUnavailable, "the last answer was 'held'; the wait ended, no node failed")
	require.NoError(t, holder.Release(ctx))
}

// wakerFake is the fake Strategy with a Waker whose notices the test
// sends by hand; stop's handOn argument is reported on stops.
type wakerFake struct {
	*fake
	notices chan struct{}
	waiters chan string // Watch's waiter argument
	stops   chan bool
	// during, if set, runs inside the next Acquire (then is cleared).
	during func()
	// listening: Listen finds the key's subscription live.
	listening bool
	watches   int // Watch calls
	// sent: a notice was sent with notify; sentAtStop: whether one had
	// been when stop was called, unreadAtStop: whether it was still in
	// notices then (all under mu).
	sent, sentAtStop, unreadAtStop bool
}

// notify sends a notice and records that it was sent, in one step under
// mu, so that stop, which reads the record under mu, tells whether the
// waiter could have had it.
func (w *wakerFake) notify() {
	w.mu.Lock()
	w.notices <- struct{}{}
	w.sent = true
	w.mu.Unlock()
}

// stop is the stop function of a watch: it records whether a notice had
// been sent, then reports handOn.
func (w *wakerFake) stop(handOn bool) {
	w.mu.Lock()
	w.sentAtStop, w.unreadAtStop = w.sent, len(w.notices) > 0
	w.mu.Unlock()
	w.stops <- handOn
}

func (w *wakerFake) Acquire(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	w.mu.Lock()
	during := w.during
	w.during = nil
	w.mu.Unlock()
	if during != nil {
		during()
	}
	return w.fake.Acquire(ctx, key, token, ttl)
}

func newWakerFake() *wakerFake {
	return &wakerFake{fake: newFake(), notices: make(chan struct{}, 1), waiters: make(chan string, 1), stops: make(chan bool, 1)}
}

// Listen reports the subscription live only if listening is set.
func (w *wakerFake) Listen(_ context.Context, key, waiter string) (<-chan struct{}, func(bool), bool) {
	if !w.listening {
		return nil, nil, false
	}
	w.waiters <- waiter
	return w.notices, w.stop, true
}

func (w *wakerFake) Watch(ctx context.Context, key, waiter string) (<-chan struct{}, func(bool), error) {
	w.mu.Lock()
	w.watches++
	w.mu.Unlock()
	w.waiters <- waiter
	return w.notices, w.stop, nil
}

// A release wakes one waiter of the process (Waker); a waiter that leaves
// owing its notice must hand it on, or the key sits free until the other
// waiters' backoff. Each case holds the key under another token, starts a
// Lock that waits an hour between attempts, and forces one order of
// events; stop's handOn must say whether a notice went unanswered.
func TestAWaiterLeavingWithAnUnansweredNoticeHandsItOn(t *testing.T) {
	unavailable := redlease.ErrUnavailable // as the strategies answer an attempt nodes failed
	cases := []struct {
		name string
		// after the waiter is asleep in its backoff: what happens, and
		// what stop must be told
		run  func(w *wakerFake, cancel context.CancelFunc)
		want bool
	}{
		{"woken, attempt refused, then gives up: answered", func(w *wakerFake, cancel context.CancelFunc) {
			w.notices <- struct{}{}
			synctest.Wait()
			cancel()
		}, false},
		{"woken, attempt failed on the way, then gives up: unanswered", func(w *wakerFake, cancel context.CancelFunc) {
			w.mu.Lock()
			w.failNext = []error{unavailable}
			w.mu.Unlock()
			w.notices <- struct{}{}
			synctest.Wait()
			cancel()
		}, true},
		{"woken, gives up while its attempt is refused: unanswered (the refusal may come from a call cut short)", func(w *wakerFake, cancel context.CancelFunc) {
			w.mu.Lock()
			w.during = cancel
			w.mu.Unlock()
			w.notices <- struct{}{}
		}, true},
		// The waiter runs in parallel with the test (synctest's bubble
		// keeps GOMAXPROCS): it may leave before the notice is sent, and
		// then has none to hand on; the notice may also come between its
		// last look and stop, still unread, which the Waker hands on
		// (see Waker.Watch). Which happened is read from the fake.
		{"gives up with the notice arriving: unanswered if it came before the stop", func(w *wakerFake, cancel context.CancelFunc) {
			cancel()
			w.notify()
		}, true},
		{"woken and granted: nothing to hand on", func(w *wakerFake, cancel context.CancelFunc) {
			w.mu.Lock()
			delete(w.held, "k")
			w.mu.Unlock()
			w.notices <- struct{}{}
		}, false},
		{"gives up asleep, no notice: nothing to hand on", func(w *wakerFake, cancel context.CancelFunc) {
			cancel()
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for range 3 {
				synctest.Test(t, func(t *testing.T) {
					w := newWakerFake()
					w.held["k"] = holder{"someone-else", time.Now().Add(24 * time.Hour)}
					l, err := redlease.New(w, redlease.WithRetryDelay(time.Hour, time.Hour), redlease.WithFairness(false))
					require.NoError(t, err)
					ctx, cancel := context.WithCancel(t.Context())
					defer cancel()
					done := make(chan error, 1)
					go func() {
						lk, err := l.Lock(ctx, "k")
						if err == nil {
							err = lk.Release(context.Background())
						}
						done <- err
					}()
					require.Equal(t, "", <-w.waiters, "a Lock without fairness watches as waiter \"\"")
					synctest.Wait() // asleep in its backoff
					tc.run(w, cancel)
					err = <-done
					if err != nil {
						// Held, or the attempt failed on the way: both
						// are retried, neither is a grant.
						require.True(t, errors.Is(err, redlease.ErrNotObtained) || errors.Is(err, redlease.ErrUnavailable), "%v", err)
					}
					handOn := <-w.stops
					if strings.HasPrefix(tc.name, "gives up with the notice arriving") {
						w.mu.Lock()
						sent, unread := w.sentAtStop, w.unreadAtStop
						w.mu.Unlock()
						switch {
						case !sent:
							require.False(t, handOn, "no notice had come: nothing to hand on")
						case !handOn:
							require.True(t, unread, "a notice came and the waiter did not hand it on: it must be unread, for the Waker to hand on")
						}
						return
					}
					require.Equal(t, tc.want, handOn, "stop's handOn")
				})
			}
		})
	}
}

// In fair mode the waiter watches under its id in the line, which is what
// a release names.
func TestAFairWaiterWatchesUnderItsIDInTheLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &queuedWaker{wakerFake: newWakerFake()}
		w.held["k"] = holder{"someone-else", time.Now().Add(24 * time.Hour)}
		l, err := redlease.New(w, redlease.WithRetryDelay(time.Hour, time.Hour), redlease.WithFairness(true))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = l.Lock(ctx, "k")
		}()
		waiter := <-w.waiters
		synctest.Wait()
		cancel()
		<-done
		<-w.stops
		require.NotEmpty(t, waiter)
		require.Equal(t, w.placeID, waiter, "Watch's waiter is the Place's id")
	})
}

// queuedWaker is a wakerFake that is also a Queuer and records its
// waiter's place id.
type queuedWaker struct {
	*wakerFake
	placeID string
}

func (q *queuedWaker) AcquireInLine(ctx context.Context, key, token string, ttl time.Duration, p redlease.Place) (redlease.Grant, error) {
	q.mu.Lock()
	q.placeID = p.ID
	q.mu.Unlock()
	return q.Acquire(ctx, key, token, ttl)
}

func (q *queuedWaker) LeaveLine(ctx context.Context, key, id string) error { return nil }

// On a key whose releases the process already hears (Waker.Listen), Lock
// subscribes before its first check and waits after one refused attempt;
// otherwise it checks, subscribes (Watch) and checks again.
func TestLockJoinsALiveSubscriptionBeforeItsFirstCheck(t *testing.T) {
	for _, live := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			w := newWakerFake()
			w.listening = live
			w.held["k"] = holder{"someone-else", time.Now().Add(24 * time.Hour)}
			l, err := redlease.New(w, redlease.WithRetryDelay(time.Hour, time.Hour))
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = l.Lock(ctx, "k")
			}()
			<-w.waiters
			synctest.Wait() // asleep
			w.mu.Lock()
			attempts, watches := len(w.acquires), w.watches
			w.mu.Unlock()
			cancel()
			<-done
			<-w.stops
			if live {
				require.Equal(t, 1, attempts, "live subscription: one check, after subscribing")
				require.Zero(t, watches)
			} else {
				require.Equal(t, 2, attempts, "check, subscribe, check again")
				require.Equal(t, 1, watches)
			}
		})
	}
}

// queuedFake is a Queuer and Waker whose AcquireInLine answers from a
// script, one answer per attempt (the last one repeats), and records when
// each attempt came. No notice is ever sent: every one is lost.
type queuedFake struct {
	*wakerFake
	mu      sync.Mutex
	answers []error // nil: granted
	at      []time.Time
}

func (q *queuedFake) AcquireInLine(ctx context.Context, key, token string, ttl time.Duration, place redlease.Place) (redlease.Grant, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.at = append(q.at, time.Now())
	err := q.answers[0]
	if len(q.answers) > 1 {
		q.answers = q.answers[1:]
	}
	if err != nil {
		return redlease.Grant{}, err
	}
	return redlease.Grant{Until: time.Now().Add(ttl), Fence: 1}, nil
}

func (q *queuedFake) LeaveLine(ctx context.Context, key, id string) error { return nil }

// A fair waiter refused with ErrQueued (the key was free, another waiter
// was the line's head) has no holder's TTL to bound its wait by. The head
// takes the key within a round trip or two, or is gone: waiting the max
// retry delay (as a refusal by a holder whose notice will come does)
// would leave the waiter asleep past the head's whole hold when the
// release's notice is lost. Found by the simulator's fair-single
// (seed 1994: a Queued waiter, its notices lost, granted 536 ms after
// the holder's release, past its 280 ms TTL). After ErrQueued the wait
// ramps from the min delay instead; the next refusal, by the head now
// holding the key, carries its TTL and bounds the wait by it.
func TestAQueuedWaiterIsBoundByTheHeadsHoldNotByTheMaxDelay(t *testing.T) {
	queued := redlease.Wrap(redlease.ErrNotObtained, redlease.ErrQueued)
	synctest.Test(t, func(t *testing.T) {
		q := &queuedFake{wakerFake: newWakerFake(), answers: []error{
			queued, // the first check
			queued, // the check after subscribing: the head has not taken the key yet
			&redlease.HeldError{Remaining: 100 * time.Millisecond}, // the head holds it now
			nil, // the head's release, its notice lost: the key is free
		}}
		l, err := redlease.New(q, redlease.WithFairness(true), redlease.WithRetryDelay(10*time.Millisecond, time.Second))
		require.NoError(t, err)
		start := time.Now()
		lk, err := l.Lock(t.Context(), "k")
		require.NoError(t, err)
		require.NotNil(t, lk)
		q.mu.Lock()
		defer q.mu.Unlock()
		require.Len(t, q.at, 4)
		took := time.Since(start)
		// The ramp's first wait (at most the min delay), then the head's
		// TTL plus 1 ms: not the max delay's 0.5–1 s.
		require.LessOrEqual(t, took, 10*time.Millisecond+101*time.Millisecond,
			"granted %v after the call; attempts at %v", took, offsets(start, q.at))
	})
}

// A head that never comes (it died in line; its entry lives until its
// lifetime ends) costs the Queued waiter a ramp of attempts, not a poll
// at the min delay: at most a few more than the ramp's doublings up to
// the max delay, within one max delay's time.
func TestAQueuedWaiterRampsUpItsAttempts(t *testing.T) {
	queued := redlease.Wrap(redlease.ErrNotObtained, redlease.ErrQueued)
	synctest.Test(t, func(t *testing.T) {
		q := &queuedFake{wakerFake: newWakerFake(), answers: []error{queued}}
		l, err := redlease.New(q, redlease.WithFairness(true), redlease.WithRetryDelay(10*time.Millisecond, 640*time.Millisecond))
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		_, err = l.Lock(ctx, "k")
		require.ErrorIs(t, err, redlease.ErrQueued)
		q.mu.Lock()
		defer q.mu.Unlock()
		// Waits drawn from [d/2, d], d = 10, 20, …, 640 ms, then 640 ms:
		// 3 s hold at most 2 checks, 7 ramp steps and 3 s / 320 ms more
		// (a poll at the min delay would make about 300).
		require.LessOrEqual(t, len(q.at), 2+7+10, "attempts at %v", offsets(time.Time{}, q.at))
	})
}

// offsets returns ts as durations since start (since ts[0] if start is
// zero).
func offsets(start time.Time, ts []time.Time) []time.Duration {
	if start.IsZero() && len(ts) > 0 {
		start = ts[0]
	}
	out := make([]time.Duration, len(ts))
	for i, t := range ts {
		out[i] = t.Sub(start)
	}
	return out
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

// Do watches its lock's loss without a goroutine of its own: 10,000 Do
// calls at once (1,000 under the race detector, whose goroutines cost ten
// times the time), each inside fn, hold at most 100 goroutines beyond
// their callers' (the default watchdog's, go-redis's, the test's). Real
// redis-server, the single strategy, the default keeper, a client without
// ContextTimeoutEnabled: each call to Redis then runs in a goroutine that
// ends with its reply (internal/bounded), so the count is taken once
// those have ended, the callers all still inside fn. A Do that gives up
// at the outage limit fails the test unless the same run measured the
// process or the node too slow for its attempts (outageExcused).
func TestDoHoldsNoGoroutineOfItsOwn(t *testing.T) {
	const extra = 100
	calls := 10_000
	if raceEnabled {
		calls = 1_000
	}
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	s, err := single.New(srv.Client())
	require.NoError(t, err)
	l := newLocker(t, s)
	// How the node answers, on a client of the probe's own (the callers'
	// pool is theirs to wait on): what excuses a Do's outage (outageExcused).
	node := redistest.StartNodeProbe(t, srv.Client())
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
			if errors.Is(err, redlease.ErrUnavailable) {
				continue // judged when it came (outageExcused)
			}
			require.NoError(t, err)
		}
		waitNoWatchGoroutines(t)
	}()
	inside := calls // callers inside fn
	for i := range calls {
		err := redistest.Await(t, probe, entered, time.Minute, 3, "%d of %d Do calls got their locks", i, calls)
		if errors.Is(err, redlease.ErrUnavailable) {
			// Do gave up after the outage limit: a window of the library's
			// (DefaultOutageLimit), judged by what the same run measured.
			why, ok := outageExcused(probe, node, time.Now())
			require.True(t, ok, "Do gave up for want of its node: %s: %v", why, err)
			t.Logf("a Do gave up for want of its node (excused, not counted inside fn): %s: %v", why, err)
			inside--
			continue
		}
		require.NoError(t, err, "Do")
	}
	held := 0
	probe.WaitFor(t, 5*time.Second, 3, 10*time.Millisecond, func() bool {
		held = runtime.NumGoroutine() - base - inside
		return held <= extra
	}, "%d Do calls inside fn hold more than %d goroutines beyond the callers'", inside, extra)
	t.Logf("%d Do calls inside fn: %d goroutines beyond the callers'", inside, held)
}

// outageMultiple: a Do's outage is excused when this process was measured
// stalled for 1/outageMultiple of the outage limit before it gave up, or
// that share of the PINGs to its node meanwhile took longer than a call
// bound (its attempts' bound): the machine did not run the test or the
// node.
const outageMultiple = 2

// outageExcused judges a Do that gave up at at for want of nodes: its
// attempts failed for the outage limit before at. A node that stopped
// answering PINGs altogether (a refused connection ends the probe's
// watch: the server went away) is not excused. why gives the figures.
func outageExcused(probe *redistest.StallProbe, node *redistest.NodeProbe, at time.Time) (why string, ok bool) {
	from := at.Add(-redlease.DefaultOutageLimit)
	stalled := probe.Stalled(from, at)
	_, late, sent := node.Late(from, at, redlease.DefaultCallBound)
	why = fmt.Sprintf("in the outage limit %v before it gave up, this process was measured stalled %v, %d of the %d PINGs sent to the node took longer than the call bound %v; excused only when %d × either reaches the whole",
		redlease.DefaultOutageLimit, stalled.Round(time.Millisecond), late, sent, redlease.DefaultCallBound, outageMultiple)
	return why, outageMultiple*stalled >= redlease.DefaultOutageLimit || (sent > 0 && outageMultiple*late >= sent)
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

// lateGrants grants like fake, but with less validity left than the loss
// margin, as a grant whose reply came back late does.
type lateGrants struct{ *fake }

func (s lateGrants) Acquire(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	g, err := s.fake.Acquire(ctx, key, token, ttl)
	if err == nil {
		g.Until = time.Now().Add(ttl / 20)
	}
	return g, err
}

// Do never starts fn with a lock already past its deadline (Until less
// the loss margin): such a lock is as good as lost, and fn would start
// work its ctx cancels a moment later — or, if the goroutine that cancels
// it is slow, after Until, when another holder may already be granted.
func TestDoDoesNotStartFnWithALockPastItsDeadline(t *testing.T) {
	l, err := redlease.New(lateGrants{newFake()}, redlease.WithTTL(time.Second), redlease.WithoutKeeper())
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond) // Lock tries again until then
	defer cancel()
	err = l.Do(ctx, "k", func(context.Context, *redlease.Lock) error {
		t.Error("fn started with a lock past its deadline")
		return nil
	})
	// (Lock tried until its ctx ended: its error may be that of an attempt
	// or of the ctx alone.)
	assert.ErrorIs(t, err, redlease.ErrNotObtained)

	// TryLock gives such a grant back and says not obtained, because the
	// lock was born lost.
	lk, err := l.TryLock(t.Context(), "k2")
	assert.Nil(t, lk)
	assert.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.ErrorIs(t, err, redlease.ErrLost)
}

// Audit issue 27, defect 4: Do's release after fn was bounded by the
// lock's TTL, so a primary that paused as fn returned held Do for the
// whole TTL (30 s by default). Forced order: fn stops the server (SIGSTOP)
// and returns; Do's release gets no answer. Do must return within the
// strategy's call bound, far sooner than the 20 s TTL, whether the client
// applies ctx deadlines to its sockets (ContextTimeoutEnabled) or not. The
// client's read timeout is longer than the TTL, so that go-redis's own
// timeouts and retries (about 10 s with its defaults) cannot end the
// release first and hide the bound Do sets.
func TestDoReleaseIsBoundedByTheCallBound(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	const ttl = 20 * time.Second
	for _, ctxTimeouts := range []bool{true, false} {
		name := "ContextTimeoutEnabled"
		if !ctxTimeouts {
			name = "without ContextTimeoutEnabled"
		}
		t.Run(name, func(t *testing.T) {
			srv := redistest.Start(t, redistest.Config{})
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: ctxTimeouts, ReadTimeout: 2 * ttl})
			t.Cleanup(func() { _ = c.Close() })
			t.Cleanup(srv.Resume) // before the client closes and the server is killed
			l := singleLocker(t, c, redlease.WithTTL(ttl))
			var paused time.Time
			err := l.Do(t.Context(), "attack:do-release", func(ctx context.Context, lk *redlease.Lock) error {
				srv.Pause()
				paused = time.Now()
				return nil
			})
			elapsed := time.Since(paused)
			require.NoError(t, err, "a failed release after fn is not reported")
			require.False(t, paused.IsZero(), "fn ran")
			if ok, why := probe.Within(elapsed, ttl/2, 3, paused); !ok {
				assert.Failf(t, "outside the window derived from this run", "Do returned %v after the server paused, with a %v TTL: %s", elapsed, ttl, why)
			}
			t.Logf("Do returned %v after the server paused", elapsed.Round(time.Millisecond))
		})
	}
}

// holdLong runs one Do with fn longer than 3×ttl on l, and checks on the
// way that the lock stays held: fn's ctx is not cancelled, another locker
// is refused, Until moves. It returns once Do has.
//
// Keeping the lock is liveness: each renewal needs this process to run
// and the node to answer within the stretch it has. A loss is judged by
// keptLockLoss with what the probes measured in that stretch: a failure
// unless excused, and an excused loss ends the checks that need the lock.
// That nobody else gets the key while the lock is Valid stays exact.
func holdLong(t *testing.T, l, other *redlease.Locker, key string, ttl time.Duration, probe *redistest.StallProbe, node *redistest.NodeProbe, opts ...redlease.LockOption) {
	t.Helper()
	ctx := t.Context()
	var refused, checks int
	var firstUntil, lastUntil time.Time
	var held *redlease.Lock
	err := l.Do(ctx, key, func(ctx context.Context, lk *redlease.Lock) error {
		held = lk
		firstUntil = lk.Until()
		end := time.Now().Add(3*ttl + ttl/2)
		for time.Now().Before(end) {
			select {
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(ttl / 4):
			}
			if ctx.Err() != nil { // both were ready: the select chose at random
				return context.Cause(ctx)
			}
			checks++
			got, err := other.TryLock(ctx, key)
			if err == nil {
				// The key had expired. Exact: the lock must no longer be
				// Valid (its deadline comes before its key's expiry), or
				// two hold it; fn's ctx is then cancelled late only
				// because this process was not run at the deadline (the
				// documented limit), and the loss is judged below.
				valid := lk.Valid()
				require.NoError(t, got.Release(t.Context())) // not fn's ctx, whose cancel is due
				if valid {
					t.Errorf("another locker got the key while the lock is Valid (Until %s, now %s)", lk.Until().Format("15:04:05.000"), time.Now().Format("15:04:05.000"))
					return nil
				}
				soft := &redistest.SoftTB{TB: t}
				redistest.Await(soft, probe, ctx.Done(), ttl, 3, "fn's ctx is cancelled once its lock is past its deadline")
				if soft.Failed() != "" {
					t.Error(soft.Failed())
				}
				return context.Cause(ctx)
			}
			if assert.ErrorIs(t, err, redlease.ErrNotObtained, "the key is held while fn runs") {
				refused++
			}
		}
		lastUntil = lk.Until()
		assert.NoError(t, ctx.Err(), "fn's ctx is not cancelled")
		assert.True(t, lk.Valid())
		return nil
	}, opts...)
	if errors.Is(err, redlease.ErrLost) && held != nil {
		why, excused := keptLockLoss(probe, node, held)
		if !excused {
			t.Errorf("Do keeps its lock past 3×TTL without any option, unless its renewal could not run: %s", why)
			return
		}
		t.Logf("lock lost while this process or its node was measured too slow for its renewal (excused): %s", why)
	} else {
		require.NoError(t, err, "Do keeps its lock past 3×TTL without any option")
		assert.Equal(t, checks, refused)
		assert.Greater(t, lastUntil.Sub(firstUntil), 2*ttl, "the lock was extended several times")
	}

	lk, err := other.TryLock(ctx, key)
	require.NoError(t, err, "released after Do")
	require.NoError(t, lk.Release(ctx))
}

// keptLockMultiple is the multiple of the measured slowness (this
// process's stall plus the node's worst PING) that excuses a kept lock's
// loss: slow for half the stretch its last renewal had.
const keptLockMultiple = 2

// keptLockLoss judges a kept lock that was lost. Its last renewal had the
// stretch from when it fell due (a third of its TTL after the grant or
// extension that set its Until, the default watchdog's fraction) to its
// deadline (Until less the loss margin). The loss is excused (ok) only if
// keptLockMultiple × (what the stall probe measured this process stalled
// + the worst round trip of a PING to the node) in that stretch reaches
// the stretch: a renewal needs both the process and the node. why gives
// the figures.
func keptLockLoss(probe *redistest.StallProbe, node *redistest.NodeProbe, lk *redlease.Lock) (why string, ok bool) {
	ttl := lk.TTL()
	from, to := lk.Until().Add(-ttl+ttl/3), lk.Deadline()
	stretch := to.Sub(from)
	stalled := probe.Stalled(from, to)
	worst, pings := node.Worst(from, to)
	slow := time.Duration(keptLockMultiple) * (stalled + worst)
	return fmt.Sprintf("its last renewal had %v (%s to %s); this process was measured stalled %v of it (worst single stall %v), the worst of %d PINGs to its node took %v; excused only at %d × (stall + PING) = %v ≥ the stretch: %v",
		stretch.Round(time.Millisecond), from.Format("15:04:05.000"), to.Format("15:04:05.000"), stalled.Round(time.Millisecond),
		probe.Worst(from, to).Round(time.Millisecond), pings, worst.Round(time.Millisecond), keptLockMultiple, slow.Round(time.Millisecond), lk.Err()), slow >= stretch
}

// Do with no option renews its lock: a function three and a half TTLs long
// keeps it from start to end, and the key is free after. The default
// watchdog's goroutines exist while it runs and are gone once Do returned,
// and a later Do starts them again.
func TestDoKeepsLockByDefault(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	c := redistest.Start(t, redistest.Config{}).Client()
	s, err := single.New(c)
	require.NoError(t, err)
	node := redistest.StartNodeProbe(t, c) // the strategy's own client
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
		holdLong(t, l, other, t.Name(), ttl, probe, node)
		close(stop)
		wg.Wait()
		assert.Positive(t, during, "round %d: the default watchdog ran", round)
		// The watchdog's goroutines end on their own once no Do runs:
		// awaited in a window derived from this run, then nothing else
		// may be left.
		waitNoWatchGoroutines(t)
		goleak.VerifyNone(t, baseline)
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
