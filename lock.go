package redlease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Lock is one held lease. Its methods are safe for concurrent use, and safe
// on a nil *Lock (which holds nothing: Release and Extend return ErrNotHeld,
// Valid is false).
//
// A Lock moves one way: held → released, or held → lost. Once Lost is closed
// it stays closed and the Lock cannot be extended; take a new one.
// Sending a Release ends the hold at once, before any reply: a release that
// fails in the client may still be applied on the nodes, and another
// holder may then be granted the key.
type Lock struct {
	strategy Strategy
	key      string // as the caller gave it
	fullKey  string // with the Locker's prefix, as sent to Redis
	token    string
	margin   time.Duration // Lost closes this long before until
	fence    uint64

	mu    sync.Mutex
	until time.Time
	// ttl is the TTL of the latest Lock.Extend (ttlSeq, by extendSeq) whose
	// answer came and was not a refusal, or the acquisition's (ttlSeq 0);
	// the lock's TTL is that of a later one still in flight, if any
	// (ttlLocked).
	ttl       time.Duration
	ttlSeq    uint64
	extendSeq uint64 // Lock.Extend calls sent
	// Extensions (Lock.Extend's and keepers' renewals) a node may apply
	// after another extension: those in flight, and those answered
	// (replied) after that other one started. An extension that succeeded
	// can only vouch for its start plus the shortest TTL among them (see
	// extensionCapLocked). undecidedTTL is the shortest TTL of those whose
	// answer never came: they may land at any time, so they cap every
	// later extension.
	extends      []*pendingExtend
	undecidedTTL time.Duration
	cause        error // non-nil once lost
	// failed is the error of the last extension that failed undecided
	// (ErrUnavailable: which nodes failed, and how) before the deadline,
	// since the last one that succeeded; a loss by expiry names it.
	failed   error
	sent     bool   // a Release was sent: whatever came back, the lock claims nothing any more
	released bool   // a Release confirmed the key gone (or not ours)
	reported bool   // the Observer was told how the hold ended
	report   func() // that telling, run by unlock outside lk.mu
	// ended, made by the first Lost or afterEnd call, is cancelled once
	// the lock is lost or a release was sent: its Done is Lost's channel,
	// and context.AfterFunc waits on it without a goroutine (afterEnd).
	ended    context.Context
	endedNow context.CancelFunc
	expiry   *time.Timer // started with ended; marks the lock lost at until−margin
	untrack  func()      // from a Revoker strategy; run once the lock is released or lost

	observer Observer  // nil: none
	granted  time.Time // for the hold time an Observer is told
	clock    Clock     // judges validity; the system clock unless WithClock
}

func newLock(s Strategy, key, fullKey, token string, ttl, margin time.Duration, g Grant) *Lock {
	// ended (Lost's channel) and the expiry timer are made on the first
	// Lost call: most locks are taken and released without anyone
	// selecting on Lost, and Valid and Err check the clock themselves.
	return &Lock{
		strategy: s,
		key:      key,
		fullKey:  fullKey,
		token:    token,
		ttl:      ttl,
		margin:   margin,
		clock:    systemClock{},
		fence:    g.Fence,
		until:    g.Until,
	}
}

// Key returns the key as given to TryLock or Lock (without the Locker's
// prefix).
func (lk *Lock) Key() string {
	if lk == nil {
		return ""
	}
	return lk.key
}

// Shard names the server that serves the lock's key now, for a strategy
// whose keys live on several independent servers (see Sharder: a Cluster
// client's master), and "" otherwise. The watchdogs group renewals by it.
func (lk *Lock) Shard() string {
	if lk == nil {
		return ""
	}
	if s, ok := lk.strategy.(Sharder); ok {
		return s.Shard(lk.fullKey)
	}
	return ""
}

// Token returns the random token (128 bits from crypto/rand) that identifies
// this holder in Redis. The locks of a set taken in one step (see
// Locker.LockAll) share one token, each on its own key.
func (lk *Lock) Token() string {
	if lk == nil {
		return ""
	}
	return lk.token
}

// Fence returns the fencing token of this acquisition (0 when the strategy
// has fencing off). Storage that remembers the highest fence it accepted
// and rejects anything not greater stops a holder that kept working after
// losing the lock.
func (lk *Lock) Fence() uint64 {
	if lk == nil {
		return 0
	}
	return lk.fence
}

// TTL returns the lock's TTL: that of the latest Lock.Extend sent, whether
// or not its answer came (unless the strategy refused it as invalid, which
// sends nothing), or before any the TTL the lock was taken with. Keepers
// (ExtendAll: renew.Watchdog, Do's default keeper) renew the lock with it,
// so that renewals keep the lock by the TTL its latest Extend chose.
func (lk *Lock) TTL() time.Duration {
	if lk == nil {
		return 0
	}
	lk.mu.Lock()
	defer lk.unlockMu()
	return lk.ttlLocked()
}

// ttlLocked is TTL.
func (lk *Lock) ttlLocked() time.Duration {
	ttl, seq := lk.ttl, lk.ttlSeq
	for _, p := range lk.extends {
		if !p.done && p.seq > seq {
			ttl, seq = p.ttl, p.seq
		}
	}
	return ttl
}

// Until returns the end of the current validity on the monotonic clock,
// drift allowance already subtracted. Extend moves it. The lock counts as
// lost a little earlier, at Until minus the loss margin (WithLossMargin), so
// that its holder has time to stop before anyone else can get in.
func (lk *Lock) Until() time.Time {
	if lk == nil {
		return time.Time{}
	}
	lk.mu.Lock()
	defer lk.unlockMu()
	return lk.until
}

// Valid reports whether the lock is still held as far as this process can
// tell: no Release sent, not known lost, and Until minus the loss margin
// not yet passed. A true answer
// is only as good as the strategy's assumptions (bounded clock drift, nodes
// that keep their data) and goes stale immediately; use Fence at the
// storage for anything that must not happen twice.
func (lk *Lock) Valid() bool {
	if lk == nil {
		return false
	}
	lk.mu.Lock()
	defer lk.unlockMu()
	lk.checkExpiryLocked()
	return lk.heldLocked()
}

// heldLocked: neither lost nor given up.
func (lk *Lock) heldLocked() bool { return lk.cause == nil && !lk.sent }

// Lost returns a channel that is closed once the lock stops being this
// process's to use: it is known lost (Until minus the loss margin passed
// without an extension, an extension found it not held, or the
// strategy revoked it), or a Release was sent. Err tells which: nil after
// a Release that was confirmed (or is still in flight), an error that
// errors.Is ErrLost otherwise.
//
// A timer closes it at the deadline, a loss margin before Until, and a
// timer runs only when the process does: one that the machine does not run
// for longer than the margin (stopped, paused, starved of CPU) sees Lost
// close after Until, as late as the process resumes. Valid, Err and Extend
// read the clock themselves and never report the lock held past its
// deadline, however late the timer; for work that must not outlive the
// lock, that is what a Fence is for.
func (lk *Lock) Lost() <-chan struct{} {
	if lk == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	lk.mu.Lock()
	defer lk.unlockMu()
	lk.armExpiryLocked()
	return lk.ended.Done()
}

// armExpiryLocked makes ended and starts the expiry timer, once.
func (lk *Lock) armExpiryLocked() {
	if lk.ended != nil {
		return
	}
	// Look at the deadline before ended exists: a lock found expired here
	// is ended by checkExpiryLocked, which would cancel an ended made
	// before it.
	lk.checkExpiryLocked()
	lk.ended, lk.endedNow = context.WithCancel(context.Background())
	if lk.heldLocked() {
		lk.expiry = time.AfterFunc(lk.deadlineLocked().Sub(lk.clock.Now()), lk.expire)
	} else {
		lk.endedNow()
	}
}

// afterEnd runs f in a goroutine of its own once Lost closes (the lock
// lost, or a release sent), as context.AfterFunc does, and no goroutine
// waits meanwhile: a timer and a context's callback list do. stop
// prevents f from running, and reports false if f has started.
func (lk *Lock) afterEnd(f func()) (stop func() bool) {
	lk.mu.Lock()
	lk.armExpiryLocked()
	ended := lk.ended
	lk.unlockMu()
	return context.AfterFunc(ended, f)
}

// Context returns a copy of parent that is cancelled once Lost closes,
// with the lock's error (Err) as its cause: the lock is lost (its cause
// errors.Is ErrLost), or a Release was sent (no cause of the lock's:
// context.Canceled). No goroutine waits for it: the timer behind Lost
// and a context callback do. stop cancels the copy (if the lock has not)
// and detaches it from the lock; it returns once a cancellation by the
// lock already under way has finished, so that after stop the copy's
// cause stays as it is. Locker.Do runs fn on such a context, and the
// idempotency Barrier its handlers. On a nil Lock the copy is cancelled
// at once, with ErrNotHeld as its cause.
func (lk *Lock) Context(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	if lk == nil {
		cancel(ErrNotHeld)
		return ctx, func() {}
	}
	told := make(chan struct{})
	detach := lk.afterEnd(func() {
		defer close(told)
		cancel(lk.Err())
	})
	return ctx, func() {
		if !detach() {
			<-told // the loss (or the release) is being told: let it finish
		}
		cancel(nil)
	}
}

// Err returns nil while the lock has not been lost, and afterwards an error
// that errors.Is ErrLost and wraps the cause. A Release that failed counts
// as a loss (the key may or may not be gone); one that succeeded does not.
func (lk *Lock) Err() error {
	if lk == nil {
		return ErrNotHeld
	}
	lk.mu.Lock()
	defer lk.unlockMu()
	lk.checkExpiryLocked()
	return lk.cause
}

// op describes an operation on this lock for the Observer.
func (lk *Lock) op(name string) Op {
	return Op{Name: name, Strategy: strategyName(lk.strategy), Key: lk.key}
}

// Release gives the lock up: the key is removed on the strategy's nodes
// where it is still held under this lock's token. It returns ErrNotHeld if
// the lock had already expired or been taken over there, which means work
// done under it may not have been exclusive.
//
// The hold ends when the release is sent, whatever comes back: Valid turns
// false, Extend is refused and Lost closes at once, because a release whose
// reply never came (ctx cancelled, a slow node) may still be applied, and
// then another holder can be granted the key. If the release fails, Err
// reports the lock lost with the failure as its cause; Release may be
// called again to retry it (ErrUnavailable, ctx). After a Release that
// returned nil or ErrNotHeld, further calls return ErrNotHeld without a
// round trip.
func (lk *Lock) Release(ctx context.Context) error {
	if lk == nil {
		return ErrNotHeld
	}
	lk.mu.Lock()
	if lk.released {
		lk.unlockMu()
		return ErrNotHeld
	}
	wasHeld := lk.heldLocked()
	lk.sent = true // before sending: from here on the key may be gone
	if wasHeld {
		lk.endLocked()
	}
	lk.unlockMu()

	ctx, done := observe(ctx, lk.observer, lk.op("release"))
	err := lk.strategy.Release(ctx, lk.fullKey, lk.token)
	done(err)
	lk.mu.Lock()
	if err == nil || errors.Is(err, ErrNotHeld) {
		lk.released = true
	} else if lk.cause == nil {
		lk.cause = &lostError{key: lk.key, what: "release sent but not confirmed", cause: err}
	}
	lk.reportLocked(lk.cause)
	lk.unlockMu()
	return err
}

// usableLocked returns ErrNotHeld (wrapping the cause) if the lock was
// released or lost.
func (lk *Lock) usableLocked() error {
	lk.checkExpiryLocked()
	switch {
	case lk.cause != nil:
		return Wrap(ErrNotHeld, lk.cause)
	case lk.sent:
		return fmt.Errorf("%w: released", ErrNotHeld)
	}
	return nil
}

// errExpired is the cause of a lock whose validity ran out.
var errExpired = errors.New("validity (less the loss margin) ran out without an extension")

// deadlineLocked is when the lock counts as lost without an extension.
func (lk *Lock) deadlineLocked() time.Time { return lk.until.Add(-lk.margin) }

// checkExpiryLocked marks the lock lost if its validity (less the margin)
// has run out.
func (lk *Lock) checkExpiryLocked() {
	if lk.heldLocked() && !lk.clock.Now().Before(lk.deadlineLocked()) {
		if lk.failed != nil {
			lk.markLostLocked(&lostError{what: errExpired.Error() + "; the last extension failed", cause: lk.failed, also: errExpired})
		} else {
			lk.markLostLocked(errExpired)
		}
	}
}

// expire runs when the expiry timer fires.
func (lk *Lock) expire() {
	lk.mu.Lock()
	defer lk.unlockMu()
	lk.checkExpiryLocked() // does nothing if an extension moved until meanwhile
	if lk.heldLocked() && lk.expiry != nil {
		// Not yet, by the lock's clock (extended, or a clock that runs
		// slower than the timer): look again when it says so.
		lk.expiry.Reset(max(lk.deadlineLocked().Sub(lk.clock.Now()), time.Millisecond))
	}
}

// markLost records cause (the first one wins) and closes Lost.
func (lk *Lock) markLost(cause error) {
	lk.mu.Lock()
	defer lk.unlockMu()
	lk.markLostLocked(cause)
}

// unlockMu releases lk.mu. Once the lock is released or lost it also runs the
// Revoker's untrack function, once, outside lk.mu: a Revoker takes its own
// lock there, and calls markLost while holding none.
func (lk *Lock) unlockMu() {
	var untrack func()
	if lk.untrack != nil && !lk.heldLocked() {
		untrack, lk.untrack = lk.untrack, nil
	}
	report := lk.report
	lk.report = nil
	lk.mu.Unlock()
	if untrack != nil {
		untrack()
	}
	if report != nil {
		report()
	}
}

func (lk *Lock) markLostLocked(cause error) {
	if !lk.heldLocked() {
		return
	}
	if le, ok := cause.(*lostError); ok && le.key == "" {
		le.key = lk.key
		lk.cause = le
	} else {
		lk.cause = &lostError{key: lk.key, cause: cause}
	}
	lk.endLocked()
	lk.reportLocked(lk.cause)
}

// endLocked stops the expiry timer and closes Lost. Call it exactly once,
// on the way out of held (a loss, or a release sent).
func (lk *Lock) endLocked() {
	if lk.expiry != nil {
		lk.expiry.Stop()
	}
	if lk.endedNow != nil {
		lk.endedNow()
	}
}

// reportLocked arranges to tell the Observer, once, how the hold ended
// (nil: released). The telling runs in unlock, after lk.mu is released
// and Lost closed: a slow Observer costs its own time, never the loss
// notice or another caller's Valid.
func (lk *Lock) reportLocked(cause error) {
	if lk.reported {
		return
	}
	lk.reported = true
	if o := lk.observer; o != nil {
		op, d := lk.op("hold"), time.Since(lk.granted)
		lk.report = func() { o.Held(op, d, cause) }
	}
}

// lostError is a Lock's loss: "redlease: lock lost: <key>: [what: ]<cause>"
// on one line, with the cause's own "redlease: " prefix dropped (see Wrap).
// It matches ErrLost, also (when set) and cause with errors.Is and
// errors.As: a loss by expiry after failed extensions names the failed
// nodes (*NodeError) of the last one.
type lostError struct {
	key   string
	what  string // what happened, before the cause ("" for none)
	cause error
	also  error // another error it matches (errExpired), or nil
}

func (e *lostError) Error() string {
	var b strings.Builder
	b.WriteString(ErrLost.Error())
	b.WriteString(": ")
	b.WriteString(e.key)
	if e.what != "" {
		b.WriteString(": ")
		b.WriteString(e.what)
	}
	b.WriteString(": ")
	b.WriteString(strings.TrimPrefix(e.cause.Error(), "redlease: "))
	return b.String()
}

func (e *lostError) Unwrap() []error {
	if e.also != nil {
		return []error{ErrLost, e.also, e.cause}
	}
	return []error{ErrLost, e.cause}
}

// ErrLost means a lock was lost while its holder still believed in it: its
// validity ran out without a successful renewal, or a renewal showed it was
// not held. Lock.Err returns it (wrapping the cause) once Lock.Lost is
// closed.
var ErrLost = errors.New("redlease: lock lost")

// Deadline returns when the lock counts as lost unless an extension comes
// first: Until minus the loss margin (WithLossMargin), when Lost closes.
// An extension that has not answered by then comes too late for the
// holder, so keepers wait for none beyond it. Extend moves it. It is the
// zero time for a nil Lock.
func (lk *Lock) Deadline() time.Time {
	if lk == nil {
		return time.Time{}
	}
	lk.mu.Lock()
	defer lk.unlockMu()
	return lk.deadlineLocked()
}

// Strategy returns the strategy the lock was taken through (nil for a nil
// Lock). Keepers group locks by it, since locks of one strategy share its
// nodes and can be extended in one call.
func (lk *Lock) Strategy() Strategy {
	if lk == nil {
		return nil
	}
	return lk.strategy
}

// observeRenewal reports one renewal by ExtendAll to the lock's Observer,
// as an "extend" that began at sent (when its round trip to the strategy
// began) and has just ended.
func (lk *Lock) observeRenewal(sent time.Time, err error) {
	if lk.observer == nil {
		return
	}
	op := lk.op("extend")
	op.Began = sent
	_, done := lk.observer.Start(context.Background(), op)
	done(err)
}
