package redlease

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/redlease/redlease/internal/watch"
)

// Keeper keeps locks alive by extending them before they expire. The renew
// package's Watchdog is one, shared by a whole process. Locker.Do uses the
// Keeper given with WithKeeper, or else the process-wide default watchdog.
type Keeper interface {
	// Keep extends lk from now on until stop is called, lk is released, or
	// lk is lost. Calling stop more than once is harmless.
	Keep(lk *Lock) (stop func())
}

// Revoker is a Strategy that can learn, after the fact, that grants it made
// are void: the failover strategy, when a Sentinel failover may have
// dropped locks that the old primary had granted. The Locker calls Track
// for every acquisition before it sends the request, so a revocation that
// comes while the grant's reply is on its way is not missed; the strategy
// calls revoke (from any goroutine, without holding its own locks) to mark
// that lock lost (at once, or as soon as the grant arrives), and the Locker
// calls untrack when the attempt fails or the lock is released or lost.
type Revoker interface {
	Track(key, token string, revoke func(cause error)) (untrack func())
}

// Extension asks for one key to be extended: the request side of
// BatchExtender.
type Extension struct {
	Key   string
	Token string
	TTL   time.Duration
}

// Extended is the outcome of one Extension: the new Grant, or an error with
// the same meaning as from Strategy.Extend.
type Extended struct {
	Grant Grant
	Err   error
}

// BatchExtender is a Strategy that can extend many keys at once, in one
// round trip per node instead of one per key. ExtendAll uses it where a
// strategy has it. The result slice matches items one to one.
type BatchExtender interface {
	ExtendBatch(ctx context.Context, items []Extension) []Extended
}

// ExtendAll extends every lock by its own TTL and records each outcome on
// its lock as Lock.Extend would (a new Until, or the lock marked lost when
// it is no longer held), except that an extension never moves Until back:
// one that started before another already recorded says nothing newer.
// Locks already released or lost get ErrNotHeld without a round trip. The
// result matches locks one to one.
//
// Locks are grouped by strategy; a strategy that is a BatchExtender gets
// one call for its whole group, any other gets one Extend per lock. Groups
// run at the same time, each on its own goroutine (one group runs on the
// caller's), and each under its own deadline: ctx's, narrowed to the
// latest Deadline (Until less the loss margin) among its locks, past which
// an answer comes too late for every one of them (a lock whose own
// deadline passes first is lost then, and a late answer does not revive
// it; a lock near its deadline does not cut the call short for the
// others). A slow or hung strategy therefore never delays another's group.
//
// ExtendAll returns once every group's call has returned. A strategy whose
// client ignores the context (go-redis without ContextTimeoutEnabled waits
// for its ReadTimeout and retries) can hold it past the deadline; the renew
// package's Watchdog stops waiting at the deadline instead.
func ExtendAll(ctx context.Context, locks []*Lock) []error {
	errs := make([]error, len(locks))
	groups := groupByStrategy(locks, errs)
	switch len(groups) {
	case 0:
		return errs
	case 1:
		extendGroup(ctx, locks, groups[0], errs)
		return errs
	}
	var wg sync.WaitGroup
	for _, g := range groups[1:] {
		wg.Go(func() { extendGroup(ctx, locks, g, errs) })
	}
	extendGroup(ctx, locks, groups[0], errs)
	wg.Wait()
	return errs
}

// strategyGroup is the locks (indexes into ExtendAll's slice) of one strategy.
type strategyGroup struct {
	s   Strategy
	idx []int
}

// groupByStrategy groups the usable locks by strategy and records ErrNotHeld
// (with its cause) in errs for the others.
func groupByStrategy(locks []*Lock, errs []error) []strategyGroup {
	var groups []strategyGroup
	for i, lk := range locks {
		if lk == nil {
			errs[i] = ErrNotHeld
			continue
		}
		if err := lk.usable(); err != nil {
			errs[i] = err
			continue
		}
		g := -1
		if comparableStrategy(lk.strategy) { // == on an incomparable dynamic value panics
			for j := range groups {
				if groups[j].s == lk.strategy {
					g = j
					break
				}
			}
		}
		if g < 0 {
			groups = append(groups, strategyGroup{s: lk.strategy})
			g = len(groups) - 1
		}
		groups[g].idx = append(groups[g].idx, i)
	}
	return groups
}

// comparableStrategy reports whether s can be compared with == (and used as
// a map key) without a panic: every strategy in this module is a pointer,
// but a struct holding a slice, or an interface holding one, is not.
func comparableStrategy(s Strategy) bool {
	if s == nil {
		return true
	}
	t := reflect.TypeOf(s)
	return t.Kind() == reflect.Pointer || reflect.ValueOf(s).Comparable()
}

// extendGroup extends one strategy's locks under the group's own deadline
// (the latest of theirs) and records the outcomes in errs.
func extendGroup(ctx context.Context, locks []*Lock, grp strategyGroup, errs []error) {
	deadline := locks[grp.idx[0]].Deadline()
	for _, i := range grp.idx[1:] {
		if d := locks[i].Deadline(); d.After(deadline) {
			deadline = d
		}
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	s, idx := grp.s, grp.idx
	b, ok := s.(BatchExtender)
	if !ok {
		for _, i := range idx {
			lk := locks[i]
			start := lk.clock.Now()
			g, err := s.Extend(ctx, lk.fullKey, lk.token, lk.ttl)
			errs[i] = lk.applyExtension(start, g, err)
			lk.observeRenewal(errs[i])
		}
		return
	}
	items := make([]Extension, len(idx))
	starts := make([]time.Time, len(idx))
	for j, i := range idx {
		starts[j] = locks[i].clock.Now()
		items[j] = Extension{Key: locks[i].fullKey, Token: locks[i].token, TTL: locks[i].ttl}
	}
	out := b.ExtendBatch(ctx, items)
	for j, i := range idx {
		if j >= len(out) {
			errs[i] = fmt.Errorf("%w: strategy returned %d results for %d extensions", ErrUnavailable, len(out), len(items))
			continue
		}
		errs[i] = locks[i].applyExtension(starts[j], out[j].Grant, out[j].Err)
		locks[i].observeRenewal(errs[i])
	}
}

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
	defer lk.unlock()
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

// Do takes key (with the Locker's retry policy, like Lock), keeps it alive
// while fn runs, and releases it only after fn has returned, so that
// whatever fn committed is visible before anyone else can take the key.
//
// The lock is kept alive by the Locker's Keeper (WithKeeper) or, by
// default, by the one process-wide default watchdog: it extends the lock
// every third of its TTL, like a renew.Watchdog with default options, and
// costs one goroutine plus at most two per strategy however many Do calls
// run at once. It starts with the first Do and ends its goroutines
// whenever no Do is running (after a renewal call still in flight
// returns), so a program or test that waits for its Do calls leaves none
// behind. WithoutKeeper turns renewal off: fn must then finish within the
// lock's first TTL, less the loss margin.
//
// fn's ctx is cancelled, with the lock's error as its cause, as soon as the
// lock is known lost (a renewal found it no longer held, or none succeeded
// before the loss margin); fn should stop and not commit then. Do returns
// fn's error; if the lock was lost before fn returned, the error also
// errors.Is ErrLost, even if fn returned nil. Failing to obtain the lock
// returns the error of Lock and does not call fn.
//
// A failed release after fn (a node down, say) is not reported: fn's work
// was done under a valid lock, and the key expires at its TTL. A panic in fn
// stops the renewal, releases the lock and is then re-raised.
//
// The default watchdog runs on the real clock. Inside a testing/synctest
// bubble, give Do WithoutKeeper or a Keeper made in the bubble
// (WithKeeper(renew.New())): the default's goroutines and channels belong
// to whichever bubble, or none, started them.
func (l *Locker) Do(ctx context.Context, key string, fn func(ctx context.Context, lk *Lock) error, opts ...LockOption) (err error) {
	if fn == nil {
		return Invalid("nil function")
	}
	c, err := l.config(key, opts)
	if err != nil {
		return err
	}
	lk, err := l.Lock(ctx, key, opts...)
	if err != nil {
		return err
	}
	stopKeeping := func() {}
	switch {
	case c.noKeeper:
	case l.keeper != nil:
		stopKeeping = l.keeper.Keep(lk)
	default:
		stopKeeping = defaultKeeper().Keep(lk)
	}

	fnCtx, cancel := context.WithCancelCause(ctx)
	var watch sync.WaitGroup
	done := make(chan struct{})
	watch.Go(func() {
		select {
		case <-lk.Lost():
			cancel(lk.Err())
		case <-done:
		}
	})
	defer func() {
		close(done)
		watch.Wait()
		stopKeeping()
		cancel(nil)
		lost := lk.Err() // read before Release: a lock released in time is not lost
		relCtx, relCancel := context.WithTimeout(context.WithoutCancel(ctx), lk.ttl)
		_ = lk.Release(relCtx)
		relCancel()
		switch {
		case lost == nil:
		case err == nil:
			err = lost
		default:
			err = fmt.Errorf("%w; %w", err, lost)
		}
	}()
	return fn(fnCtx, lk)
}

// observeRenewal reports one renewal by ExtendAll to the lock's Observer
// (as an "extend" that has already ended).
func (lk *Lock) observeRenewal(err error) {
	if lk.observer == nil {
		return
	}
	_, done := lk.observer.Start(context.Background(), lk.op("extend"))
	done(err)
}

// defaultKeeper is the one process-wide default watchdog that Do uses
// without WithKeeper: renew.Watchdog's engine with its default options,
// made on first use, whose goroutines run only while it keeps a lock or a
// renewal call is in flight.
var defaultKeeper = sync.OnceValue(func() *watch.Engine[*Lock] {
	return watch.New(watch.Config[*Lock]{
		Extend:   ExtendAll,
		NotHeld:  func(err error) bool { return errors.Is(err, ErrNotHeld) },
		Lane:     func(lk *Lock) any { return watch.LaneKey(lk.strategy, lk) },
		IdleStop: true,
	})
})
