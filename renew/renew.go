package renew

import (
	"errors"
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/renewal"
)

// Defaults, in one place.
const (
	// DefaultFraction: a lock is extended when this share of its TTL has
	// passed since its last extension (ttl/3), leaving two more chances
	// before it would expire.
	DefaultFraction = renewal.DefaultFraction
	// DefaultTimeout is the renewal timeout: how long the Watchdog waits
	// for one strategy's renewal call before it retries, and the longest
	// Close waits for calls in flight.
	DefaultTimeout = renewal.DefaultTimeout
	// DefaultMaxCalls is how many renewal calls may be in flight per
	// strategy, counting calls the Watchdog stopped waiting for that have
	// not returned yet.
	DefaultMaxCalls = renewal.DefaultMaxCalls
	// MaxRetryDelay bounds the wait before a renewal that failed without a
	// verdict (a node down, a timeout, an error reply) is tried again: the
	// delay is a quarter of the lock's renewal interval, at most this.
	MaxRetryDelay = renewal.MaxRetryDelay
)

// Option configures a Watchdog.
type Option interface {
	apply(*Watchdog) error
}

type optionFunc func(*Watchdog) error

func (f optionFunc) apply(w *Watchdog) error { return f(w) }

// WithFraction sets a lock's renewal interval: fraction of its TTL. A lock
// is extended between half and three quarters of its interval after its
// last extension (see the package documentation: early, so that locks
// fall into batches; later only when the strategy's call slots are busy
// or the process does not run). Default DefaultFraction (1/3). Must be
// in (0, 1); above 1/2 a single failed round leaves no time for a retry.
func WithFraction(fraction float64) Option {
	return optionFunc(func(w *Watchdog) error {
		if !(fraction > 0 && fraction < 1) {
			return redlease.Invalid("renew fraction %v: must be in (0, 1)", fraction)
		}
		w.fraction = fraction
		return nil
	})
}

// WithTimeout sets the renewal timeout: the longest the Watchdog waits for
// one strategy's renewal call (never past the latest Deadline of the
// call's locks) before it counts the call as failed and schedules a retry,
// and the longest Close waits for calls in flight. Default DefaultTimeout
// (1 s). Must be at least a millisecond. Keep it above the strategy's own
// bound on a call (failover's WAIT timeout) and below the renewal
// interval, so that a timed-out renewal leaves time for retries. A
// strategy that states its bound (redlease.CallBounder; quorum: its node
// timeout) is waited for at least twice that, whatever this timeout says.
func WithTimeout(d time.Duration) Option {
	return optionFunc(func(w *Watchdog) error {
		if d < time.Millisecond {
			return redlease.Invalid("renew timeout %v: must be at least 1ms", d)
		}
		w.timeout = d
		return nil
	})
}

// WithMaxCalls sets how many renewal calls may be in flight for one
// strategy at a time, counting calls the Watchdog stopped waiting for
// (past their deadline) that the strategy has not returned yet: a client
// that ignores its context keeps such a call, and a goroutine, until its
// own timeouts end it. Locks of a strategy at its limit wait for a call to
// return; other strategies are not affected. Default DefaultMaxCalls (2).
// Must be at least 1.
func WithMaxCalls(n int) Option {
	return optionFunc(func(w *Watchdog) error {
		if n < 1 {
			return redlease.Invalid("renew max calls %d: must be at least 1", n)
		}
		w.maxCalls = n
		return nil
	})
}

// WithClock makes the Watchdog read the time from c, which must be the
// clock of the Locker whose locks it keeps (redlease.WithClock): it
// compares their Until and Deadline with c's readings. Default
// redlease.SystemClock(). Its timers run in real time, armed from c's
// readings and re-armed while c says "not yet", as a Lock's are: with a
// clock that runs faster than real time, extensions come late.
func WithClock(c redlease.Clock) Option {
	return optionFunc(func(w *Watchdog) error {
		if c == nil {
			return redlease.Invalid("renew: nil clock")
		}
		w.clock = c
		return nil
	})
}

// Watchdog keeps any number of locks alive with one scheduling goroutine
// and, per strategy, at most a few renewal calls in flight (one goroutine
// each). It is safe for concurrent use; share one per process. Close it
// when done.
//
// A Locker without WithKeeper keeps Do's locks with a process-wide watchdog
// of its own, which works like a Watchdog with the default options and ends
// its goroutines whenever it keeps no lock. A Watchdog of your own is for
// other options, for locks you take with Lock rather than Do, or for a
// Close you control.
type Watchdog struct {
	fraction float64
	timeout  time.Duration
	maxCalls int
	clock    redlease.Clock // nil: the system clock

	eng *renewal.Engine[*redlease.Lock]
}

var _ redlease.Keeper = (*Watchdog)(nil)

// New starts a Watchdog. Invalid options are reported, never defaulted.
func New(opts ...Option) (*Watchdog, error) {
	w := &Watchdog{
		fraction: DefaultFraction,
		timeout:  DefaultTimeout,
		maxCalls: DefaultMaxCalls,
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(w); err != nil {
			return nil, err
		}
	}
	w.eng = renewal.New(renewal.Config[*redlease.Lock]{
		Fraction: w.fraction,
		Timeout:  w.timeout,
		MaxCalls: w.maxCalls,
		Extend:   redlease.ExtendAll,
		NotHeld:  notHeld,
		Lane:     laneKey,
		Now:      now(w.clock),
	})
	return w, nil
}

// Keep extends lk by its TTL (Lock.TTL, read again at every renewal) every
// fraction of it until stop is called, lk is released, or lk is lost (a
// renewal that finds it not held marks it lost; one that cannot get an
// answer in time leaves it to expire, and its Lost closes a loss margin
// before its Until). Keeping a lock that is
// already kept, or keeping after Close, does nothing.
func (w *Watchdog) Keep(lk *redlease.Lock) (stop func()) { return w.eng.Keep(lk) }

// Len returns how many locks the Watchdog keeps. A lock that expired while
// its strategy had no call slot free still counts until the Watchdog gets
// to it.
func (w *Watchdog) Len() int { return w.eng.Len() }

// Close stops the Watchdog: no lock is extended any more, and the calls in
// flight are cancelled. It waits for the scheduler and for those calls,
// but for the calls at most the renewal timeout (WithTimeout): a
// call whose client ignores its context (go-redis without
// ContextTimeoutEnabled, on a hung node) is left to end on its own, at the
// client's own timeout or when the client is closed, and at most
// WithMaxCalls of them per strategy exist. Kept locks stay held until they
// expire or are released. Calling Close again waits the same way. It
// returns nil (io.Closer).
func (w *Watchdog) Close() error {
	w.eng.Close()
	return nil
}

// now is the engine's clock for c: nil (time.Now, with deadlines as
// given) for the system clock.
func now(c redlease.Clock) func() time.Time {
	if c == nil || c == redlease.SystemClock() {
		return nil
	}
	return c.Now
}

// laneKey is what groups locks into lanes: their strategy, or the lock
// itself for a strategy that cannot be a map key.
func laneKey(lk *redlease.Lock) any { return renewal.LaneKey(lk.Strategy(), lk) }

// notHeld: a renewal's verdict that the lock is not held.
func notHeld(err error) bool { return errors.Is(err, redlease.ErrNotHeld) }
