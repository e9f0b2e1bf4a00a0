package redlease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	jittered "github.com/redlease/redlease/internal/backoff"
)

// MaxPermits is the largest number of permits a Semaphore may have. A
// permit is a lock key, and a round of TryAcquire tries each one round
// trip after another: a semaphore near this size is slow to find its
// last free permit.
const MaxPermits = 1024

// Semaphore hands out at most N permits at once across every process that
// uses it (same strategy nodes, same Locker prefix, same name and N).
//
// A Semaphore named S with N permits is N ordinary lock keys, its slots,
// "S#0" to "S#<N-1>", and a permit is the *Lock of one slot: taken through
// the strategy's Acquire like any lock, with its own token, its own fence
// and its own Until, renewed by a Keeper (Do; a renew.Watchdog) and lost
// (Lost, Err, Context) exactly as a Lock is. It adds no script and no
// state on the nodes. So the guarantee follows from the strategy's mutual
// exclusion, slot by slot, under the strategy's own assumptions (see the
// package doc and the strategy's): at no time do more than N holders
// believe (Lock.Valid) that they hold a permit, on single, failover and
// quorum alike; on a quorum each slot is a Redlock key with its own
// majority.
//
// What it does not give:
//   - Fences are per slot. Lock.Fence rises from one holder of a slot to
//     the next, not across slots: storage that fences permits keeps the
//     highest fence per slot key (Lock.Key) and compares a permit's fence
//     with that slot's, never with another slot's.
//   - No fairness: a waiting Acquire tries the slots in rounds, and a
//     waiter may be passed by others that came later. On a Waker (single,
//     failover, quorum) and without WithPolling, after its first round
//     the nodes refused it subscribes to every slot's releases (up to
//     MaxWatchedPermits slots; a larger semaphore polls), tries again at
//     once, and then a release wakes it (one waiter per process and slot,
//     as for Lock; a notice it did not use goes on to the next). Notices
//     are hints: otherwise, and for a lost one, a released permit is found
//     at the next round, within the Locker's max retry delay; a permit
//     whose holder died, within the holder's remaining TTL (+1 ms) as the
//     refusing nodes reported it. WithFairness has no effect on a permit:
//     no waiter joins a slot's line.
//   - A holder paused past its TTL still believes it holds its permit
//     when it wakes, exactly as for a Lock: Valid, Lost and the fence are
//     how it learns otherwise.
//   - The bound holds among callers that agree on N. A caller that opens
//     the same name with a larger N (or locks a slot key by Lock) lets
//     more in: the bound is then the largest N in use.
//
// Its methods are safe for concurrent use.
type Semaphore struct {
	l     *Locker
	name  string
	slots []string
}

// Semaphore returns the semaphore called name with n permits (see
// Semaphore). It makes no round trip. An empty name, or n below 1 or above
// MaxPermits, is an error that errors.Is ErrInvalid.
func (l *Locker) Semaphore(name string, n int) (*Semaphore, error) {
	switch {
	case l == nil:
		return nil, Invalid("nil Locker")
	case name == "":
		return nil, Invalid("empty semaphore name")
	case n < 1 || n > MaxPermits:
		return nil, Invalid("semaphore %q: %d permits, want 1 to %d", name, n, MaxPermits)
	}
	slots := make([]string, n)
	for i := range slots {
		slots[i] = name + "#" + strconv.Itoa(i)
	}
	return &Semaphore{l: l, name: name, slots: slots}, nil
}

// Name returns the semaphore's name, as given ("" for a nil Semaphore).
func (s *Semaphore) Name() string {
	if s == nil {
		return ""
	}
	return s.name
}

// Permits returns N, the number of permits (0 for a nil Semaphore).
func (s *Semaphore) Permits() int {
	if s == nil {
		return 0
	}
	return len(s.slots)
}

// Slots returns the slots' keys (without the Locker's prefix), slot i at
// index i: a permit's Lock.Key is one of them.
func (s *Semaphore) Slots() []string {
	if s == nil {
		return nil
	}
	return append([]string(nil), s.slots...)
}

// TryAcquire tries each slot once, one after another from a slot drawn at
// random, and returns the first permit granted. It never waits for a
// holder. If no slot was granted it returns a *PermitError: it errors.Is
// ErrUnavailable if the nodes decided no answer for at least one slot (an
// outage is never "all held"), and ErrNotObtained if every slot it tried
// was refused as held; ErrDenied and ErrInvalid are returned at once. If
// ctx ends first, the error also errors.Is ctx's error; TryAcquire
// returns by ctx's deadline. Options apply to the permit as to TryLock's
// lock (WithTTL, WithLossMargin, ...). A nil or zero Semaphore returns
// ErrInvalid.
func (s *Semaphore) TryAcquire(ctx context.Context, opts ...LockOption) (*Lock, error) {
	c, err := s.config(opts)
	if err != nil {
		return nil, err
	}
	lk, err := s.round(ctx, c, jittered.NewStream(ctx, semStartTag), nil)
	if err != nil && ctx.Err() != nil {
		err = withCause(err, context.Cause(ctx))
	}
	return lk, err
}

// Acquire waits for a permit: it tries every slot (as TryAcquire does),
// and while none is granted waits and tries again, with the Locker's
// jittered backoff (WithRetryDelay), each wait cut at the shortest
// remaining TTL a refusing slot reported (+1 ms), until a permit is
// granted, ctx is done, WithMaxAttempts rounds are spent, or rounds that
// left a slot undecided (an outage) have lasted the outage limit
// (WithOutageLimit; the error then errors.Is ErrUnavailable, not
// ErrNotObtained). After its first refused round it subscribes to the
// slots' releases, where it can, and a release ends its wait (see
// Semaphore).
// When ctx ends the wait the error errors.Is ctx's error, and the last
// round's ErrNotObtained or ErrUnavailable. ErrDenied and ErrInvalid are
// returned at once. Acquire returns by ctx's deadline.
func (s *Semaphore) Acquire(ctx context.Context, opts ...LockOption) (*Lock, error) {
	c, err := s.config(opts)
	if err != nil {
		return nil, err
	}
	return s.wait(ctx, c)
}

// Do takes a permit as Acquire does, keeps it alive while fn runs and
// releases it only after fn returned, exactly as Locker.Do does for a key:
// the Locker's Keeper (or the process-wide default watchdog; none with
// WithoutKeeper) renews it, fn's ctx is cancelled as soon as the permit is
// known lost, and Do returns fn's error, with the loss as well (errors.Is
// ErrLost) if the permit was lost before fn returned. Failing to take a
// permit returns Acquire's error and does not call fn.
func (s *Semaphore) Do(ctx context.Context, fn func(ctx context.Context, permit *Lock) error, opts ...LockOption) error {
	if fn == nil {
		return Invalid("nil function")
	}
	c, err := s.config(opts)
	if err != nil {
		return err
	}
	lk, err := s.wait(ctx, c)
	if err != nil {
		return err
	}
	return s.l.runKept(ctx, c, lk, fn)
}

// Jitter tags of a semaphore call's streams (internal/backoff): the slot
// each round starts from, and the waits between rounds.
const (
	semStartTag = 0x5e3a_0001
	semWaitTag  = 0x5e3a_0002
)

// config is the call's config (the Locker's defaults and opts), checked
// as a lock's on the first slot.
func (s *Semaphore) config(opts []LockOption) (lockConfig, error) {
	if s == nil || len(s.slots) == 0 {
		return lockConfig{}, Invalid("nil Semaphore, or not made by Locker.Semaphore")
	}
	return s.l.config(s.slots[0], opts)
}

// round tries every slot once, from one start drawn from start, and
// returns the first permit granted, or a *PermitError (or at once the
// error of a slot that no retry changes: ErrDenied, ErrInvalid). It stops
// when ctx ends.
func (s *Semaphore) round(ctx context.Context, c lockConfig, start *jittered.Stream, answered func(slot int)) (*Lock, error) {
	n := len(s.slots)
	first := int(start.N(time.Duration(n)))
	pe := &PermitError{Name: s.name, Slots: make([]error, n)}
	undecided := 0
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		slot := (first + i) % n
		lk, err := s.l.try(ctx, c, s.slots[slot])
		if answered != nil && ctx.Err() == nil && (err == nil || errors.Is(err, ErrNotObtained) && !errors.Is(err, ErrUnavailable)) {
			answered(slot) // the nodes decided this slot
		}
		if err == nil {
			return lk, nil
		}
		pe.Slots[slot] = err
		switch {
		case errors.Is(err, ErrUnavailable):
			if ctx.Err() == nil { // the caller's deadline decides nothing
				undecided++
			}
		case errors.Is(err, ErrNotObtained):
			if left, ok := holderRemaining(err); ok && (!pe.remains || left < pe.remaining) {
				pe.remaining, pe.remains = left, true
			}
		default:
			return nil, fmt.Errorf("semaphore %q, slot %d: %w", s.name, slot, err)
		}
	}
	pe.Err = ErrNotObtained
	if undecided > 0 {
		pe.Err = ErrUnavailable
	}
	return nil, pe
}

// wait is Acquire with the call's config made, observed as a "wait" on
// the semaphore's name.
func (s *Semaphore) wait(ctx context.Context, c lockConfig) (*Lock, error) {
	ctx, done := observe(ctx, s.l.observer, Op{Name: "wait", Strategy: strategyName(c.strategy), Key: s.name})
	lk, err := s.retry(ctx, c)
	done(err)
	return lk, err
}

// retry is Acquire's loop: a round, and while no slot is granted, a wait
// and another round. The outage accounting is Lock's (see outage), by
// rounds: a round that left a slot undecided is down.
func (s *Semaphore) retry(ctx context.Context, c lockConfig) (lk *Lock, err error) {
	start := jittered.NewStream(ctx, semStartTag)
	jitter := jittered.NewStream(ctx, semWaitTag)
	out := outage{limit: c.outageLimit}
	var (
		w       semWaiting
		refused error // the last round that every slot refused
	)
	defer func() { w.end(s.slotOf(lk)) }()
	for round := 1; ; round++ {
		w.takeNotices()
		if round > 1 && ctx.Err() != nil {
			return nil, withCause(err, context.Cause(ctx))
		}
		actx, cancelRound := out.bound(ctx)
		began := time.Now()
		lk, err = s.round(actx, c, start, w.answered)
		down := ctx.Err() == nil && err != nil && (errors.Is(err, ErrUnavailable) || actx.Err() != nil)
		cancelRound()
		if out.over(began, down, err) {
			return nil, outageError(err, out.lastDown, c.outageLimit)
		}
		if err == nil || !(errors.Is(err, ErrNotObtained) || errors.Is(err, ErrUnavailable)) {
			return lk, err
		}
		if ctx.Err() != nil {
			if refused != nil && errors.Is(err, ErrUnavailable) {
				err = refused // the deadline cut this round: the slots' last answer stands
			}
			return nil, withCause(err, context.Cause(ctx))
		}
		if !errors.Is(err, ErrUnavailable) {
			refused = err
		}
		if c.maxAttempts > 0 && round >= c.maxAttempts {
			return nil, err
		}
		if !down && !errors.Is(err, ErrUnavailable) && w.watch(ctx, c, s.l.prefix, s.slots) {
			continue // subscribed: a release between the round and now was not heard
		}
		n := round
		if w.subscribed() && !errors.Is(err, ErrUnavailable) {
			// A release wakes this call (see Lock's wait): the backoff
			// only covers a lost notice or a holder that never releases,
			// whose remaining TTL cuts it.
			n = fullDelay
		}
		d := backoff(jitter, n, c.minDelay, c.maxDelay)
		var pe *PermitError
		if errors.As(err, &pe) && pe.remains {
			d = min(d, pe.remaining+time.Millisecond)
		}
		if !w.sleep(ctx, out.cap(d)) {
			return nil, withCause(err, context.Cause(ctx))
		}
	}
}

// slotOf returns the index of lk's slot, -1 for a nil lk.
func (s *Semaphore) slotOf(lk *Lock) int {
	if lk == nil {
		return -1
	}
	return slices.Index(s.slots, lk.Key())
}

// PermitError is a Semaphore's failure to get a permit in a round: the
// error of every slot it tried. It errors.Is Err, and errors.As finds the
// slots' own errors (a *QuorumError, a *NodeError) among those of that
// kind.
type PermitError struct {
	Name string // the semaphore's
	// Err is ErrUnavailable if the nodes decided no answer for at least
	// one slot (an outage, not a holder), else ErrNotObtained: every slot
	// tried was refused as held.
	Err error
	// Slots holds each slot's error, slot i at index i; nil for a slot not
	// tried because the caller's ctx ended first.
	Slots []error

	remaining time.Duration // the shortest remaining TTL a refusing slot reported
	remains   bool
}

// permitErrorSlots is how many slots' errors Error spells out.
const permitErrorSlots = 4

// Error says how many slots were held and undecided, and the first few
// slots' errors.
func (e *PermitError) Error() string {
	var held, down, untried int
	for _, err := range e.Slots {
		switch {
		case err == nil:
			untried++
		case errors.Is(err, ErrUnavailable):
			down++
		default:
			held++
		}
	}
	var b strings.Builder
	b.WriteString(e.Err.Error())
	fmt.Fprintf(&b, ": semaphore %q: %d of %d slots held", e.Name, held, len(e.Slots))
	if down > 0 {
		fmt.Fprintf(&b, ", %d undecided", down)
	}
	if untried > 0 {
		fmt.Fprintf(&b, ", %d not tried", untried)
	}
	shown := 0
	for i, err := range e.Slots {
		if err == nil {
			continue
		}
		if shown == permitErrorSlots {
			fmt.Fprintf(&b, "; ...")
			break
		}
		fmt.Fprintf(&b, "; slot %d: %s", i, strings.TrimPrefix(err.Error(), "redlease: "))
		shown++
	}
	return b.String()
}

// Unwrap returns Err and the slots' errors that match it.
func (e *PermitError) Unwrap() []error {
	errs := []error{e.Err}
	for _, err := range e.Slots {
		if err != nil && errors.Is(err, e.Err) {
			errs = append(errs, err)
		}
	}
	return errs
}
