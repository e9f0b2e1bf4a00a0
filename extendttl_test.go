package redlease_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
)

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

// plain is a Strategy with the three methods only: it states no drift
// allowance (nor anything else).
type plain struct{ s redlease.Strategy }

func (p plain) Acquire(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	return p.s.Acquire(ctx, key, token, ttl)
}
func (p plain) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	return p.s.Extend(ctx, key, token, ttl)
}
func (p plain) Release(ctx context.Context, key, token string) error {
	return p.s.Release(ctx, key, token)
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
