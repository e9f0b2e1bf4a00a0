package redlease

import (
	"time"

	"github.com/redlease/redlease/internal/fused"
)

// Defaults, in one place. Each option's documentation repeats its default.
const (
	// DefaultTTL is the lock TTL when WithTTL is not given.
	DefaultTTL = 30 * time.Second
	// DefaultMinRetryDelay and DefaultMaxRetryDelay bound the jittered,
	// doubling wait between attempts of Locker.Lock.
	DefaultMinRetryDelay = 10 * time.Millisecond
	DefaultMaxRetryDelay = 320 * time.Millisecond
	// DefaultLossMarginDivisor sets the default loss margin to a tenth of
	// the TTL: a lock that nobody managed to extend counts as lost at
	// Until − ttl/10.
	DefaultLossMarginDivisor = 10
	// DefaultFenceTTL is how long a lock's fence counter lives after its
	// last grant when the strategy is given no WithFenceTTL (or the
	// acquisition's TTL, if longer): every counter expires, and one created
	// anew starts from the server's clock, above every fence the expired
	// one handed out (see the package documentation, Fencing tokens).
	DefaultFenceTTL = 10 * time.Minute
	// DefaultOutageLimit is how long Locker.Lock and Do keep trying while
	// every attempt fails for want of nodes (ErrUnavailable), when
	// WithOutageLimit is not given.
	DefaultOutageLimit = 10 * time.Second
)

// Option configures a Locker in New. Every LockOption is also an Option:
// given to New it sets the Locker's default for that setting, given to a
// call it overrides the default for that call only.
type Option interface {
	applyLocker(*Locker)
}

// LockOption configures one TryLock, Lock or Do call (or, given to New, the
// Locker's default).
type LockOption interface {
	Option
	applyLock(*lockConfig)
}

// lockConfig is what a single lock call runs with.
type lockConfig struct {
	strategy    Strategy
	ttl         time.Duration
	minDelay    time.Duration
	maxDelay    time.Duration
	maxAttempts int // 0: until ctx is done
	outageLimit time.Duration
	margin      time.Duration
	marginSet   bool         // false: DefaultLossMargin of the ttl
	noKeeper    bool         // WithoutKeeper: Do keeps nothing alive
	polling     bool         // WithPolling: Lock does not subscribe to releases
	fair        bool         // WithFairness(true): Lock joins the key's line on a Queuer
	fused       fused.Script // attempts run it on a fused.Acquirer (internal/fused)
	err         error
}

// lossMargin is the margin for ttl: the one set with WithLossMargin, or
// ttl/DefaultLossMarginDivisor.
func (c *lockConfig) lossMargin() time.Duration {
	if c.marginSet {
		return c.margin
	}
	return c.ttl / DefaultLossMarginDivisor
}

func (c *lockConfig) fail(err error) {
	if c.err == nil {
		c.err = err
	}
}

func init() {
	fused.Option = func(s fused.Script) any {
		return lockOption(func(c *lockConfig) { c.fused = s })
	}
}

// lockOption adapts a function on lockConfig to both option interfaces.
type lockOption func(*lockConfig)

func (f lockOption) applyLock(c *lockConfig) { f(c) }
func (f lockOption) applyLocker(l *Locker)   { f(&l.defaults) }

// WithTTL sets how long the lock lives without an extension. Default
// DefaultTTL (30s). It must be positive and at least a millisecond (Redis
// expiry resolution); a lock's usable validity is shorter by the strategy's
// clock-drift allowance.
func WithTTL(ttl time.Duration) LockOption {
	return lockOption(func(c *lockConfig) {
		if ttl < time.Millisecond {
			c.fail(Invalid("ttl %v: must be at least 1ms", ttl))
			return
		}
		c.ttl = ttl
	})
}

// WithStrategy picks the Strategy for one call on a shared Locker (quorum for
// moving money, single for cheap dedup). Given to New, it replaces the
// Locker's strategy. A nil Strategy is rejected.
func WithStrategy(s Strategy) LockOption {
	return lockOption(func(c *lockConfig) {
		if isNil(s) {
			c.fail(Invalid("nil Strategy"))
			return
		}
		c.strategy = s
	})
}

// WithRetryDelay bounds the wait between attempts of Locker.Lock: the first
// wait is drawn from [min/2, min], each later one from [d/2, d] with d
// doubling up to max ("equal jitter", so contenders spread out but none
// starves on an unlucky draw). Defaults DefaultMinRetryDelay (10ms) and
// DefaultMaxRetryDelay (320ms). Requires 0 < min <= max.
//
// A refusal that reports the holder's remaining TTL (every strategy of
// this module does) cuts the wait to that TTL plus 1 ms: the key is free
// then unless it is renewed.
//
// A Lock subscribed to the key's releases (a Waker strategy, without
// WithPolling) is woken by them, so after a refusal its waits are drawn
// from [max/2, max] at once (still cut to the holder's TTL): the wait is
// only the fallback for a lost notice. After an attempt that too few
// nodes answered the ramp from min applies as above, and so it does in
// fair mode after refusals with ErrQueued and no holder's TTL (the key
// was free, another waiter was the line's head): the head takes the key
// within a round trip or two, and the next refusal then carries its TTL.
func WithRetryDelay(min, max time.Duration) LockOption {
	return lockOption(func(c *lockConfig) {
		if min <= 0 || max < min {
			c.fail(Invalid("retry delay [%v, %v]: need 0 < min <= max", min, max))
			return
		}
		c.minDelay, c.maxDelay = min, max
	})
}

// WithPolling makes Locker.Lock (and Do) wait by backoff alone: it does
// not subscribe to the key's releases even on a strategy that is a Waker,
// so it opens no subscription connection; a release then costs the waiter
// up to one backoff. Default off: a Waker strategy's waiters are woken by
// releases. For environments that cannot carry Redis pub/sub (a proxy
// without it, a testing/synctest bubble: go-redis dials a subscription
// under a mutex, which stops a bubble's virtual clock).
func WithPolling() LockOption {
	return lockOption(func(c *lockConfig) { c.polling = true })
}

// WithFairness turns fair mode on or off (see the package documentation):
// on a Strategy that is a Queuer (single, failover, quorum), the waiters
// of Lock join the key's line and are served in the order they called
// Lock, and TryLock is refused while others wait in line, even if the key
// is free. Fairness only adds refusals: mutual exclusion, fences and
// validity are the same either way. Default off: under contention it
// evens out the waits but serves fewer grants per second, since a fair
// waiter cannot barge in (the next head pays a wake-up and a round trip);
// the figures are in docs/bench/PERFORMANCE.md. A waiter's entry lasts
// LineLifetime of its retry delays after its last attempt, which bounds
// how long a waiter that died at the head of the line holds the others
// back. Give every client of a key the same setting: a client without
// fairness ignores the line.
func WithFairness(on bool) LockOption {
	return lockOption(func(c *lockConfig) { c.fair = on })
}

// LineLifetime is how long a waiter's entry stays in a key's line after
// its last attempt, for the max retry delay of WithRetryDelay:
// max(1 s, 3 × maxDelay). Every wait between attempts is at most maxDelay,
// so a live waiter refreshes its entry well within it.
func LineLifetime(maxDelay time.Duration) time.Duration {
	return max(time.Second, 3*maxDelay)
}

// WithMaxAttempts makes Locker.Lock give up after n attempts. Default 0:
// keep trying until the context is done. Negative n is rejected.
func WithMaxAttempts(n int) LockOption {
	return lockOption(func(c *lockConfig) {
		if n < 0 {
			c.fail(Invalid("max attempts %d: must be >= 0", n))
			return
		}
		c.maxAttempts = n
	})
}

// WithOutageLimit makes Locker.Lock (and Do) give up when its attempts
// have failed for want of nodes (errors.Is ErrUnavailable: nodes down,
// paused, unreachable, or too few answering) for d in a row: it then
// returns the last attempt's error, which errors.Is ErrNotObtained and
// ErrUnavailable. The run starts at the start of its first such attempt
// and ends at any attempt the nodes decided (granted or refused); the
// attempts of a run are cut off at its start plus d, so Lock returns at
// most d after the run began, or at the end of the run's first attempt if
// that is later (an attempt takes at most the strategy's call bound, see
// CallBounder). Default DefaultOutageLimit (10 s). A held key is not an
// outage: a Lock whose attempts are refused waits as long as its ctx
// allows. d must be positive.
func WithOutageLimit(d time.Duration) LockOption {
	return lockOption(func(c *lockConfig) {
		if d <= 0 {
			c.fail(Invalid("outage limit %v: must be positive", d))
			return
		}
		c.outageLimit = d
	})
}

// lockerOption is an option that only makes sense for a whole Locker.
type lockerOption func(*Locker)

func (f lockerOption) applyLocker(l *Locker) { f(l) }

// WithPrefix puts every key of this Locker under a namespace: the key sent
// to Redis is prefix+key. Default "" (keys are used as given, which is what
// interoperating with redsync on the same names needs).
func WithPrefix(prefix string) Option {
	return lockerOption(func(l *Locker) { l.prefix = prefix })
}

// WithLossMargin makes a lock count as lost d before its Until: Lost
// closes, Valid turns false and Do cancels its function's context then, so
// the holder can stop its work while the lock is still its own. Default: a
// tenth of the TTL. A margin is only useful if it is longer than the holder
// needs to notice and stop; 0 means "at Until". Must be at least 0 and
// shorter than the TTL.
func WithLossMargin(d time.Duration) LockOption {
	return lockOption(func(c *lockConfig) {
		if d < 0 {
			c.fail(Invalid("loss margin %v: must not be negative", d))
			return
		}
		c.margin, c.marginSet = d, true
	})
}

// WithKeeper gives the Locker a Keeper (a renew.Watchdog, say) that Do
// uses to keep its locks alive while its function runs. Without it Do uses
// the process-wide default watchdog (see Locker.Do). A nil Keeper, or
// WithKeeper and WithoutKeeper both given to New, is rejected with
// ErrInvalid. WithoutKeeper given to one Do call still turns keeping off
// for that call.
func WithKeeper(k Keeper) Option {
	return lockerOption(func(l *Locker) {
		switch {
		case k == nil:
			l.defaults.fail(Invalid("nil Keeper"))
		case l.defaults.noKeeper:
			l.defaults.fail(Invalid("WithKeeper and WithoutKeeper together"))
		default:
			l.keeper = k
		}
	})
}

// WithoutKeeper turns off the renewal of Do's lock: given to New, for every
// Do of the Locker; given to one Do call, for that call (even on a Locker
// with WithKeeper). Do then runs its function within the lock's first TTL
// and cancels its context at the loss margin (WithLossMargin), when the
// lock counts as lost. TryLock and Lock, which keep nothing, ignore it.
// Given to New together with WithKeeper, it is rejected with ErrInvalid.
func WithoutKeeper() LockOption { return withoutKeeper{} }

type withoutKeeper struct{}

func (withoutKeeper) applyLock(c *lockConfig) { c.noKeeper = true }

func (withoutKeeper) applyLocker(l *Locker) {
	if l.keeper != nil {
		l.defaults.fail(Invalid("WithKeeper and WithoutKeeper together"))
		return
	}
	l.defaults.noKeeper = true
}

// WithClock makes the Locker's locks judge their validity by c. Default
// SystemClock(). Valid and Err follow c exactly; Lost's timer is armed in
// real time from c's reading and re-armed while c says "not yet", so with a
// clock that runs faster than real time Lost may close late (Valid is
// already false by then).
func WithClock(c Clock) Option {
	return lockerOption(func(l *Locker) {
		if c == nil {
			l.defaults.fail(Invalid("nil Clock"))
			return
		}
		l.clock = c
	})
}

// WithObserver reports every lock operation of this Locker, and of the
// locks it hands out, to o.
func WithObserver(o Observer) Option {
	return lockerOption(func(l *Locker) {
		if o == nil {
			l.defaults.fail(Invalid("nil Observer"))
			return
		}
		l.observer = o
	})
}
