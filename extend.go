package redlease

// The accounting of a lock's extensions: Lock.Extend and a keeper's
// renewals, the extensions a node may still apply after another one, and
// how far each answer may move Until.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redlease/redlease/internal/renewal"
)

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
