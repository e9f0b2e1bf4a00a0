package redlease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// Found by the simulator's state-valid invariant (F1; ops-quorum seeds
// 6946 and 9070): a quorum Extend returns once a quorum answered, while
// its copies to the other nodes may still be in flight (or not yet sent:
// the fanout's per-node queues). Such a late copy of a shorter extension
// can land on a node after a later, longer one (on another connection:
// nothing orders them) and, if it resets the TTL, cut the key there back
// to the shorter TTL; a node that missed the longer extension still has
// the shorter one, and then fewer than a quorum hold the key until the
// lock's Until, although every extension asked for more than the one
// before. Forced order on nodes A, B, C (the holder reaches each through
// a gate, the second client directly): the lock, taken for 1 s, is
// extended to 1234 ms; A and B apply it and answer, so the Extend
// returns, and C's copy is held in C's gate. The lock is extended to 20 s while B is
// black-holed: A and C apply it, so it succeeds, and the lock is valid
// for about 20 s. Then C's copy of the 1234 ms extension lands. Once B's
// key has expired, the second client may not be granted the key while the
// holder's lock is still Valid. A node never shortens a held key, so C
// keeps the 20 s; the holder's Release lets the second client in.
func TestLateShorterExtendDoesNotShortenTheKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	probe := redistest.StartStallProbe(t)
	servers := redistest.StartN(t, 3, redistest.Config{})
	gates := make([]*redistest.Gate, len(servers))
	ac := make([]redis.UniversalClient, len(servers))
	for i, s := range servers {
		loadScripts(t, s.Client())
		gates[i] = redistest.NewGate(t, s.Addr)
		ac[i] = gates[i].Client()
	}
	// A node timeout of a second: nothing here waits for a round to
	// expire, and a loaded machine must not time out the replies that do
	// come.
	qa := quorumOver(t, ac, quorum.WithNodeTimeout(time.Second))
	qb := quorumOver(t, directClients(t, servers), quorum.WithNodeTimeout(time.Second))
	la := newLocker(t, qa, redlease.WithTTL(time.Second)) // loss margin 100 ms
	lb := newLocker(t, qb, redlease.WithTTL(time.Second))
	const (
		key     = "attack:late-shorter-extend"
		short   = 1234 * time.Millisecond
		long    = 20 * time.Second
		matchS  = "$4\r\n1234\r\n" // the short extension's TTL argument, and nothing else
		nodeB   = 1
		nodeC   = 2
		stepFor = 10 * time.Second
	)
	a, err := la.TryLock(ctx, key)
	require.NoError(t, err)

	gates[nodeC].HoldRequests(matchS)
	require.NoError(t, a.Extend(ctx, short), "A and B answer: a quorum")
	require.NoError(t, gates[nodeC].WaitHeld(1, matchS, stepFor), "C's copy of the short extension is on its way")

	gates[nodeB].BlackHole() // B misses the long extension
	require.NoError(t, a.Extend(ctx, long), "A and C answer: a quorum")
	until := a.Until()
	atC, ok, err := redistest.Expiry(ctx, servers[nodeC].Client(), key)
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, atC.Add(redistest.Precision).Before(until), "the long extension landed on C: its key expires %v after A's Until", atC.Sub(until))

	require.NoError(t, gates[nodeC].Step(matchS, stepFor), "the short extension lands on C, last")
	until = a.Until()
	atC, ok, err = redistest.Expiry(ctx, servers[nodeC].Client(), key)
	require.NoError(t, err)
	require.True(t, ok)
	assert.False(t, atC.Add(redistest.Precision).Before(until),
		"node C's key after the late short extension expires %v before A's Until", until.Sub(atC))

	// Wait until B's key has expired and C's has either expired too or
	// outlives A's Until (within 10 s: both expire 1234 ms after they
	// took the short extension, or C's lives 20 s; widened by 3 × the
	// stall this run measured meanwhile, probe.WaitFor). Polled every
	// 5 ms: polling for the keys' expiry, not racing it.
	settled := func(d time.Duration) bool {
		return d == -2*time.Nanosecond || d >= time.Until(a.Until())-2*time.Millisecond
	}
	var report []string
	probe.WaitFor(t, 10*time.Second, 3, 5*time.Millisecond, func() bool {
		report = report[:0]
		done := true
		for _, i := range []int{nodeB, nodeC} {
			d, err := servers[i].Client().PTTL(ctx, key).Result()
			require.NoError(t, err)
			done = done && settled(d)
			report = append(report, fmt.Sprintf("node %c: PTTL %v", 'A'+i, d))
		}
		return done
	}, "the keys on B and C never settled: %s", redistest.Lazy(func() string { return strings.Join(report, ", ") }))

	require.True(t, a.Valid(), "A's lock must still be valid for the check to mean anything")
	b, err := lb.TryLock(ctx, key)
	if err == nil {
		t.Fatalf("double grant: the second client got the key (fence %d) while A's lock is Valid for %v more (TTL %v); %s",
			b.Fence(), time.Until(a.Until()).Round(time.Millisecond), a.TTL(), strings.Join(report, ", "))
	}
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	require.True(t, a.Valid())

	// The key kept the longer life; Release is how to let others in
	// sooner.
	require.NoError(t, a.Release(ctx))
	b, err = lb.TryLock(ctx, key)
	require.NoError(t, err, "released: the second client is granted the key")
	require.NoError(t, b.Release(ctx))
}

// hangingExtends is the fake strategy whose Extend never gets an answer:
// it returns when its ctx ends, undecided (ErrUnavailable), as a strategy
// bounding a call by its ctx does.
type hangingExtends struct{ *fake }

func (h hangingExtends) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	<-ctx.Done()
	return redlease.Grant{}, fmt.Errorf("%w: extend: %w", redlease.ErrUnavailable, ctx.Err())
}

// A kept lock whose renewal hangs is lost at its deadline, the instant the
// renewal's ctx (the lock's deadline) ends too: the lock's expiry timer and
// the renewal's return run at one instant, in the Go scheduler's order. The
// loss is decided one way whatever that order: an extension that failed
// only at the deadline or later is not named as the last one that failed,
// so Do's error is ErrLost and not ErrUnavailable. (Before, the renewal
// returning first made it name that failure, and Do's error matched
// ErrUnavailable: the simulator's ops-failover seed 18 replayed four ways.)
func TestLossAtADeadlineARenewalEndsAtIsDecidedOneWay(t *testing.T) {
	const runs = 40
	named := 0
	for range runs {
		synctest.Test(t, func(t *testing.T) {
			l, err := redlease.New(hangingExtends{newFake()}, redlease.WithTTL(100*time.Millisecond))
			require.NoError(t, err)
			var cause error
			err = l.Do(t.Context(), "job", func(ctx context.Context, lk *redlease.Lock) error {
				<-ctx.Done()
				cause = context.Cause(ctx)
				return nil
			})
			require.ErrorIs(t, err, redlease.ErrLost)
			require.ErrorIs(t, cause, redlease.ErrLost)
			if errors.Is(err, redlease.ErrUnavailable) {
				named++
			}
		})
	}
	assert.Zero(t, named, "of %d losses, %d named a renewal that failed at the deadline", runs, named)
}

// frozenClock always reads the same instant: every extension then starts
// at it, so the bounds the lock takes from them are exact.
type frozenClock struct{ at time.Time }

func (c frozenClock) Now() time.Time { return c.at }

// Audit issue 27, defect 3: an Extend whose answer never came capped the
// lock's Until with a fixed 5 % drift allowance, whatever the strategy's
// drift factor said; with WithDriftFactor(0.1) and a clock 8.7 % slow, a
// key cut back by the extension expired while the lock still counted
// itself Valid. The nodes no longer cut a held key back (the key keeps
// its 20 s here), but the lock still bounds itself as if they could:
// Until becomes the extension's start plus 4 s less the strategy's own
// allowance for 4 s (0.1 × 4 s + 2 ms), exactly, on a clock that does not
// move. Forced order: A holds the key with a 20 s TTL (loss margin 10 ms);
// its Extend to 4 s reaches the server, which applies it, but the reply
// is held in the gate until the Extend's ctx ends. B is refused until A
// releases.
func TestUndecidedExtendUsesTheStrategysDriftAllowance(t *testing.T) {
	ctx := t.Context()
	srv := redistest.Start(t, redistest.Config{})
	loadScripts(t, srv.Client())
	gate := redistest.NewGate(t, srv.Addr)
	clock := frozenClock{at: time.Now()}
	sa, err := single.New(gate.Client(), single.WithDriftFactor(0.1), single.WithClock(clock))
	require.NoError(t, err)
	la := newLocker(t, sa, redlease.WithTTL(20*time.Second), redlease.WithLossMargin(10*time.Millisecond), redlease.WithClock(clock))
	lb := singleLocker(t, srv.Client(), redlease.WithTTL(20*time.Second))
	const key = "attack:undecided-drift"
	asked := time.Now()
	a, err := la.TryLock(ctx, key)
	require.NoError(t, err)
	require.Equal(t, clock.at.Add(20*time.Second-sa.DriftAllowance(20*time.Second)), a.Until())

	gate.HoldReplies(script.Extend.Hash())
	ectx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	extErr := a.Extend(ectx, 4*time.Second)
	cancel()
	require.Error(t, extErr)
	require.NotErrorIs(t, extErr, redlease.ErrNotHeld, "undecided, not refused")
	require.Equal(t, 1, gate.HeldContaining(""), "the Extend's reply is held")
	require.Equal(t, 402*time.Millisecond, sa.DriftAllowance(4*time.Second))
	require.Equal(t, clock.at.Add(4*time.Second-402*time.Millisecond), a.Until(),
		"the undecided extension bounds the lock by the strategy's allowance")
	// The key keeps the life the acquisition gave it (20 s from a moment
	// after asked), not the 4 s the Extend asked for.
	at, ok, err := redistest.Expiry(ctx, srv.Client(), key)
	require.NoError(t, err)
	require.True(t, ok)
	require.False(t, at.Add(redistest.Precision).Before(asked.Add(20*time.Second)),
		"the Extend reached the server and left the key's longer life: it expires %v after the acquisition's start", at.Sub(asked))

	require.True(t, a.Valid())
	_, err = lb.TryLock(ctx, key)
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	gate.Open()
	require.NoError(t, a.Release(ctx))
	b, err := lb.TryLock(ctx, key)
	require.NoError(t, err, "released: B may take it")
	require.NoError(t, b.Release(ctx))
}

// gatedExtends is the fake strategy, recording the TTL of every Extend it
// is sent; an Extend to a TTL in hold says so on entered and waits until
// that channel is closed, and one to refuse is refused as invalid.
type gatedExtends struct {
	*fake
	entered chan time.Duration
	refuse  time.Duration

	mu   sync.Mutex
	hold map[time.Duration]chan struct{}
	seen []time.Duration
}

func newGated() *gatedExtends {
	return &gatedExtends{fake: newFake(), entered: make(chan time.Duration), hold: map[time.Duration]chan struct{}{}}
}

// holdTTL makes Extends to ttl wait; the returned function lets them go.
func (g *gatedExtends) holdTTL(ttl time.Duration) func() {
	ch := make(chan struct{})
	g.mu.Lock()
	g.hold[ttl] = ch
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		delete(g.hold, ttl)
		g.mu.Unlock()
		close(ch)
	}
}

func (g *gatedExtends) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	if ttl == g.refuse {
		return redlease.Grant{}, redlease.Invalid("ttl %v refused", ttl)
	}
	g.mu.Lock()
	g.seen = append(g.seen, ttl)
	ch := g.hold[ttl]
	g.mu.Unlock()
	if ch != nil {
		g.entered <- ttl
		<-ch
	}
	return g.fake.Extend(ctx, key, token, ttl)
}

// sent returns the TTLs of the Extends sent so far.
func (g *gatedExtends) sent() []time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]time.Duration(nil), g.seen...)
}

// keyEnd returns when the fake's key ends (the zero time if it holds
// none).
func (f *fake) keyEnd(key string) time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.held[key].until
}

// renewOnce runs ExtendAll on lk alone and returns its error.
func renewOnce(t *testing.T, lk *redlease.Lock) error {
	return redlease.ExtendAll(t.Context(), []*redlease.Lock{lk})[0]
}

// The lock's TTL is that of its latest Extend sent, in flight or
// answered, and keepers renew by it; an Extend the strategy refuses as
// invalid sent nothing and leaves it; of two Extends in flight together
// the later one sent sets it, whichever answers last.
func TestExtendSetsTheTTLKeepersRenewWith(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGated()
		g.refuse = 7 * time.Second
		l := newLocker(t, g, redlease.WithTTL(time.Second))
		lk, err := l.TryLock(t.Context(), "k")
		require.NoError(t, err)
		assert.Equal(t, time.Second, lk.TTL())
		require.NoError(t, lk.Extend(t.Context(), 3*time.Second))
		assert.Equal(t, 3*time.Second, lk.TTL())
		require.NoError(t, renewOnce(t, lk))
		assert.Equal(t, []time.Duration{3 * time.Second, 3 * time.Second}, g.sent(), "the renewal is by the Extend's TTL")

		require.ErrorIs(t, lk.Extend(t.Context(), 7*time.Second), redlease.ErrInvalid)
		assert.Equal(t, 3*time.Second, lk.TTL(), "a refused Extend leaves the TTL")

		// Extend to 5 s in flight: it is the TTL already.
		let5 := g.holdTTL(5 * time.Second)
		first := make(chan error)
		go func() { first <- lk.Extend(t.Context(), 5*time.Second) }()
		<-g.entered
		assert.Equal(t, 5*time.Second, lk.TTL(), "the latest Extend sent, still in flight")
		// A later Extend to 4 s answers first; the 5 s one answers last.
		require.NoError(t, lk.Extend(t.Context(), 4*time.Second))
		let5()
		require.NoError(t, <-first)
		assert.Equal(t, 4*time.Second, lk.TTL(), "the later Extend sent sets the TTL, whatever answers last")
		require.NoError(t, lk.Release(t.Context()))
	})
}

// A renewal by the old, shorter TTL still in flight when an Extend to a
// longer one answers may be applied after it and cut the key back: the
// Extend cannot move Until past its start plus the renewal's TTL. The
// next renewal, by the new TTL, moves it on. Forced order: the 1 s
// renewal is sent and held, Extend(3 s) completes, the renewal answers.
func TestShorterRenewalInFlightCapsALongerExtend(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGated()
		l := newLocker(t, g, redlease.WithTTL(time.Second))
		lk, err := l.TryLock(t.Context(), "k")
		require.NoError(t, err)
		let1 := g.holdTTL(time.Second)
		renewed := make(chan error)
		go func() { renewed <- renewOnce(t, lk) }()
		<-g.entered
		time.Sleep(100 * time.Millisecond)
		extendStart := time.Now()
		require.NoError(t, lk.Extend(t.Context(), 3*time.Second))
		assert.Equal(t, extendStart.Add(time.Second), lk.Until(), "the 1 s renewal in flight caps the 3 s Extend")
		time.Sleep(100 * time.Millisecond)
		let1()
		require.NoError(t, <-renewed)
		assert.False(t, lk.Until().After(g.keyEnd("k")), "Until %v, the key ends %v", lk.Until(), g.keyEnd("k"))
		time.Sleep(100 * time.Millisecond)
		renewalStart := time.Now()
		require.NoError(t, renewOnce(t, lk))
		assert.Equal(t, renewalStart.Add(3*time.Second), lk.Until(), "a renewal sent after both answered, by the 3 s TTL")
		require.NoError(t, lk.Release(t.Context()))
	})
}

// A renewal whose answer never came may still land at any time: it caps
// every later, longer extension at that extension's start plus the
// renewal's TTL, as an undecided Extend does.
func TestUndecidedRenewalCapsLaterExtensions(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGated()
		l := newLocker(t, g, redlease.WithTTL(time.Second))
		lk, err := l.TryLock(t.Context(), "k")
		require.NoError(t, err)
		g.failNext = []error{redlease.ErrUnavailable}
		require.ErrorIs(t, renewOnce(t, lk), redlease.ErrUnavailable)
		time.Sleep(100 * time.Millisecond)
		extendStart := time.Now()
		require.NoError(t, lk.Extend(t.Context(), 3*time.Second))
		assert.Equal(t, extendStart.Add(time.Second), lk.Until())
		require.NoError(t, lk.Release(t.Context()))
	})
}

// An Extend to a TTL whose validity would not outlast the loss margin is
// refused before anything is sent (the lock would be lost at once); one
// a millisecond longer goes out.
func TestExtendRefusesATTLWithinTheLossMargin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGated()
		l := newLocker(t, g, redlease.WithTTL(10*time.Second)) // loss margin 1 s
		lk, err := l.TryLock(t.Context(), "k")
		require.NoError(t, err)
		until := lk.Until()
		require.ErrorIs(t, lk.Extend(t.Context(), time.Second), redlease.ErrInvalid)
		assert.Empty(t, g.sent(), "nothing sent")
		assert.Equal(t, until, lk.Until())
		assert.Equal(t, 10*time.Second, lk.TTL())
		assert.True(t, lk.Valid())
		require.NoError(t, lk.Extend(t.Context(), time.Second+time.Millisecond))
		assert.Equal(t, time.Second+time.Millisecond, lk.TTL())
		require.NoError(t, lk.Release(t.Context()))
	})
}

// On a strategy that states no drift allowance the lock takes no validity
// from an extension it has no Grant for: an Extend to a TTL shorter than
// the lock's is refused (it would end the hold when sent), a longer one
// goes out, and once a renewal went unanswered a longer extension leaves
// Until where it was.
func TestStrategyWithoutDriftAllowance(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := newGated()
		l := newLocker(t, plain{g}, redlease.WithTTL(2*time.Second))
		lk, err := l.TryLock(t.Context(), "k")
		require.NoError(t, err)
		require.ErrorIs(t, lk.Extend(t.Context(), time.Second), redlease.ErrInvalid)
		assert.Empty(t, g.sent(), "nothing sent")
		time.Sleep(100 * time.Millisecond)
		start := time.Now()
		require.NoError(t, lk.Extend(t.Context(), 3*time.Second))
		assert.Equal(t, start.Add(3*time.Second), lk.Until(), "a longer Extend's Grant counts")
		require.NoError(t, renewOnce(t, lk))

		g.failNext = []error{redlease.ErrUnavailable}
		require.ErrorIs(t, renewOnce(t, lk), redlease.ErrUnavailable)
		until := lk.Until()
		time.Sleep(100 * time.Millisecond)
		require.NoError(t, lk.Extend(t.Context(), 4*time.Second))
		assert.Equal(t, until, lk.Until(), "an unanswered 3 s renewal may cut the key back at any time")
		require.NoError(t, lk.Release(t.Context()))
	})
}

func TestExtendMovesUntilAndPostponesLoss(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, _, lk := fakeLock(t, redlease.WithTTL(time.Second))
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
