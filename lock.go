package redlease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redlease/redlease/internal/renewal"
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

// Token returns the random token (128 bits from crypto/rand) that identifies
// this holder in Redis.
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

// Extend extends the lock to ttl: the strategy's nodes give the key, where
// it still holds the lock's token, at least ttl from when they apply the
// extension (the strategies of this module raise its TTL to ttl and never
// shorten a held key: one with a longer life left keeps it); ttl becomes
// the lock's TTL (the one keepers renew it with from now on; see TTL); and
// Until moves to the extension's start plus ttl, less the strategy's drift
// allowance. If the strategy says the lock is not held, the lock is
// marked lost and the error errors.Is ErrNotHeld. Other failures
// (ErrUnavailable, ctx) are undecided: the extension may still be
// applied, so the lock stays valid until the earlier of its current Until
// and the time the extension would end the key (its start plus ttl, less
// the strategy's drift allowance, see DriftAllowancer), and Extend may be
// tried again.
//
// An Extend to a shorter TTL shortens the hold from the moment it is sent,
// whether or not its answer comes: Until comes no later than its start
// plus ttl, less its allowance. The key does not shorten with it: the
// nodes keep the longer life that the acquisition or an earlier extension
// gave it, so others may be refused the key until that runs out. Release
// is how to let them in sooner.
//
// The lock bounds itself as if a node could reset the key to whatever TTL
// an extension carries (a Strategy of another module may): an extension
// (Extend's, or a keeper's renewal) cannot move Until past its own start
// plus the shortest TTL, less its allowance, of the shorter extensions a
// node may have applied after it: those in flight, those answered after
// it started, and those never answered, which cap every later extension
// so. Until never moves back on an answer: every earlier bound was one
// that the calls sent since could only shorten, and they did so when
// sent.
//
// A ttl whose validity (ttl less the strategy's drift allowance) would
// not outlast the loss margin (WithLossMargin) is refused with ErrInvalid
// and nothing is sent: the lock would count as lost the moment the
// extension went out. On a Strategy that states no drift allowance (not a
// DriftAllowancer), so is a ttl shorter than the lock's TTL, whose end the
// lock could not bound. A ttl the strategy refuses (ErrInvalid: nothing
// sent) leaves the lock's TTL as it was.
func (lk *Lock) Extend(ctx context.Context, ttl time.Duration) error {
	if lk == nil {
		return ErrNotHeld
	}
	if ttl < time.Millisecond {
		return Invalid("ttl %v: must be at least 1ms", ttl)
	}
	rec, sooner, err := lk.beginExtend(ttl)
	if err != nil {
		return err
	}
	if sooner {
		// Keepers renew it by its TTL, before its Deadline: both may have
		// come closer than their schedule says.
		renewal.Touch(lk)
	}
	ctx, done := observe(ctx, lk.observer, lk.op("extend"))
	g, err := lk.strategy.Extend(ctx, lk.fullKey, lk.token, rec.ttl)
	err = lk.finishExtend(rec, g, err)
	done(err)
	return err
}

// pendingExtend is one extension sent to the strategy, Lock.Extend's or a
// keeper's renewal, while a node may still apply it after another one:
// while it is in flight, and once answered (replied is when; zero while
// in flight) for as long as an extension that started before that answer
// is in flight.
type pendingExtend struct {
	ttl     time.Duration
	start   time.Time
	seq     uint64 // Lock.Extend's number, in sending order; 0 for a renewal
	replied time.Time
	done    bool
}

// maxPendingExtends bounds Lock.extends: past it the two oldest answered
// records merge into one that caps more (the later reply, the shorter TTL).
const maxPendingExtends = 16

// beginExtend records a Lock.Extend to ttl that is about to be sent (see
// sendLocked), or refuses it: ErrNotHeld if the lock is released or
// lost, ErrInvalid for a ttl the lock could not be held with (see
// Extend). sooner reports that the lock's TTL got shorter or its
// Deadline came closer.
func (lk *Lock) beginExtend(ttl time.Duration) (rec *pendingExtend, sooner bool, err error) {
	lk.mu.Lock()
	defer lk.unlockMu()
	if err := lk.usableLocked(); err != nil {
		return nil, false, err
	}
	prevTTL, prevUntil := lk.ttlLocked(), lk.until
	a, known := lk.allowance(ttl)
	switch {
	case ttl-a <= lk.margin:
		return nil, false, Invalid("ttl %v: its validity (less the drift allowance of %v) does not outlast the loss margin %v, so the lock would be lost once the extension is sent", ttl, a, lk.margin)
	case !known && ttl < prevTTL:
		return nil, false, Invalid("ttl %v: shorter than the lock's TTL %v, on a strategy that states no drift allowance (redlease.DriftAllowancer): the lock could not bound when the key ends", ttl, prevTTL)
	}
	lk.extendSeq++
	rec = lk.sendLocked(ttl, lk.extendSeq)
	return rec, ttl < prevTTL || lk.until.Before(prevUntil), nil
}

// beginRenewal records a keeper's renewal that is about to be sent: by
// the lock's TTL (see TTL). It returns ErrNotHeld if the lock is released
// or lost.
func (lk *Lock) beginRenewal() (*pendingExtend, error) {
	lk.mu.Lock()
	defer lk.unlockMu()
	if err := lk.usableLocked(); err != nil {
		return nil, err
	}
	return lk.sendLocked(lk.ttlLocked(), 0), nil
}

// sendLocked records an extension to ttl sent from now on (seq: see
// pendingExtend): from the moment it is sent a node may apply it, and the
// key then lives at least ttl from its arrival; the lock counts on no
// more, as if the node reset the key to ttl whatever an earlier extension
// said (the nodes of this module's strategies keep a longer life; see
// Extend). So the lock is valid at most until the extension's start
// plus ttl less the strategy's drift allowance (capLimit), if that comes before
// its Until: an extension to the lock's TTL or a longer one changes
// nothing, one to a shorter TTL shortens the hold. On a strategy
// that states no allowance nothing shorter than the lock's TTL is sent
// (beginExtend), so nothing is shortened.
func (lk *Lock) sendLocked(ttl time.Duration, seq uint64) *pendingExtend {
	rec := &pendingExtend{ttl: ttl, start: lk.clock.Now(), seq: seq}
	lk.extends = append(lk.extends, rec)
	if _, known := lk.allowance(ttl); known {
		lk.shortenLocked(lk.capLimit(rec.start, ttl))
	}
	return rec
}

// finishExtend records the strategy's answer to the extension rec (g and
// err, as Strategy.Extend returns them) and returns the error to report:
// on success a new Until (see applySuccessLocked); the loss of the lock if
// the strategy says it is not held; for other errors the lock stays
// as it was (sendLocked shortened it when the extension was sent), and an
// undecided extension caps every later one. An answer that is not a
// refusal of the ttl (ErrInvalid) makes a Lock.Extend's ttl the lock's
// TTL, unless a later Lock.Extend's already is.
func (lk *Lock) finishExtend(rec *pendingExtend, g Grant, err error) error {
	lk.mu.Lock()
	defer lk.unlockMu()
	refused := errors.Is(err, ErrInvalid) // nothing was sent
	if rec.seq > lk.ttlSeq && !refused {
		lk.ttl, lk.ttlSeq = rec.ttl, rec.seq
	}
	switch {
	case refused:
		lk.dropExtendLocked(rec)
	case undecided(err):
		if lk.undecidedTTL == 0 || rec.ttl < lk.undecidedTTL {
			lk.undecidedTTL = rec.ttl
		}
		lk.dropExtendLocked(rec)
	default:
		rec.replied, rec.done = lk.clock.Now(), true
		lk.mergeExtendsLocked()
	}
	switch {
	case err == nil:
		lk.failed = nil
		err = lk.applySuccessLocked(rec, g)
	case errors.Is(err, ErrNotHeld):
		lk.markLostLocked(err)
	case undecided(err) && lk.clock.Now().Before(lk.deadlineLocked()):
		// Only a failure while the lock is still valid: a renewal whose
		// ctx is the lock's deadline fails at the instant the expiry
		// timer fires, and which of the two runs first must not decide
		// what the loss names.
		lk.failed = err
	}
	lk.pruneExtendsLocked()
	return err
}

// dropExtendLocked forgets rec.
func (lk *Lock) dropExtendLocked(rec *pendingExtend) {
	lk.extends = slices.DeleteFunc(lk.extends, func(p *pendingExtend) bool { return p == rec })
}

// mergeExtendsLocked keeps lk.extends within maxPendingExtends by merging
// its two oldest answered records, while there are two.
func (lk *Lock) mergeExtendsLocked() {
	for len(lk.extends) > maxPendingExtends {
		i := slices.IndexFunc(lk.extends, func(p *pendingExtend) bool { return p.done })
		j := -1
		if i >= 0 {
			j = slices.IndexFunc(lk.extends[i+1:], func(p *pendingExtend) bool { return p.done })
		}
		if j < 0 {
			break // all in flight: they stay
		}
		a, b := lk.extends[i], lk.extends[i+1+j]
		b.ttl, b.replied = min(a.ttl, b.ttl), maxTime(a.replied, b.replied)
		lk.extends = slices.Delete(lk.extends, i, i+1)
	}
}

// pruneExtendsLocked forgets the answered records that can cap nothing any
// more: those answered before every extension still in flight started
// (all of them when none is in flight), since every extension sent from
// now on starts after their answer too.
func (lk *Lock) pruneExtendsLocked() {
	var oldest time.Time
	inFlight := false
	for _, p := range lk.extends {
		if !p.done && (!inFlight || p.start.Before(oldest)) {
			oldest, inFlight = p.start, true
		}
	}
	lk.extends = slices.DeleteFunc(lk.extends, func(p *pendingExtend) bool {
		return p.done && (!inFlight || !p.replied.After(oldest))
	})
}

// extensionCapLocked returns the shortest TTL shorter than ttl among the
// extensions a node may have applied after an extension to ttl that
// started at start (in flight, answered after start, or never answered),
// and whether there is any. One to ttl or longer cannot end the key before
// the extension's own arrival plus ttl.
func (lk *Lock) extensionCapLocked(start time.Time, ttl time.Duration) (time.Duration, bool) {
	var c time.Duration
	if lk.undecidedTTL > 0 && lk.undecidedTTL < ttl {
		c = lk.undecidedTTL
	}
	for _, p := range lk.extends {
		if p.done && !p.replied.After(start) {
			continue
		}
		if p.ttl < ttl && (c == 0 || p.ttl < c) {
			c = p.ttl
		}
	}
	return c, c > 0
}

// allowance returns the strategy's drift allowance for ttl, and whether
// the strategy states one (DriftAllowancer).
func (lk *Lock) allowance(ttl time.Duration) (time.Duration, bool) {
	if d, ok := lk.strategy.(DriftAllowancer); ok {
		return d.DriftAllowance(ttl), true
	}
	return 0, false
}

// capLimit is the latest Until an extension to ttl sent at start can vouch
// for without a Grant: a node that applies it keeps the key at least ttl
// after it arrives (a node that resets the TTL, exactly that long), which
// is no sooner than start, and the strategy's drift allowance for ttl
// maps that onto this process's clock. For a strategy that states no
// allowance it is start: no validity at all.
func (lk *Lock) capLimit(start time.Time, ttl time.Duration) time.Time {
	a, known := lk.allowance(ttl)
	if !known {
		return start
	}
	return start.Add(ttl - a)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// applySuccessLocked records the extension rec, which the strategy
// confirmed with g. Until moves to g.Until, held to rec's start plus the
// shortest TTL (less its allowance) among the shorter extensions that a
// node may have applied after it, and never back: every earlier Until
// was a bound that calls sent since could only shorten, and those
// shortened it when they were sent (and an answer a keeper stopped
// waiting for may arrive after that of the retry that followed it, which
// knows better).
func (lk *Lock) applySuccessLocked(rec *pendingExtend, g Grant) error {
	lk.checkExpiryLocked()
	if !lk.heldLocked() {
		// Lost or given up while the extension was in flight: the earlier
		// verdict stands.
		if lk.cause != nil {
			return Wrap(ErrNotHeld, lk.cause)
		}
		return fmt.Errorf("%w: released", ErrNotHeld)
	}
	until := g.Until
	if c, ok := lk.extensionCapLocked(rec.start, rec.ttl); ok {
		until = minTime(until, lk.capLimit(rec.start, c))
	}
	if until.After(lk.until) {
		lk.setUntilLocked(until)
	}
	return nil
}

// undecided reports whether an extension that returned err may still have
// been applied: it failed, but neither because the lock is not held nor
// because an argument was refused before anything was sent.
func undecided(err error) bool {
	return err != nil && !errors.Is(err, ErrNotHeld) && !errors.Is(err, ErrInvalid)
}

// shortenLocked makes limit the lock's Until if it comes first.
func (lk *Lock) shortenLocked(limit time.Time) {
	if lk.heldLocked() && limit.Before(lk.until) {
		lk.setUntilLocked(limit)
	}
}

// setUntilLocked moves Until to until, and the expiry timer with it; a
// deadline already past ends the hold now.
func (lk *Lock) setUntilLocked(until time.Time) {
	lk.until = until
	if lk.expiry != nil {
		lk.expiry.Reset(max(lk.deadlineLocked().Sub(lk.clock.Now()), 0))
	}
	lk.checkExpiryLocked()
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
