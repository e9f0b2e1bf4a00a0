package redlease

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"
)

// Keeper keeps locks alive by extending them before they expire. The renew
// package's Watchdog is one, shared by a whole process; Locker.Do uses the
// Keeper given with WithKeeper.
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
// its lock exactly as Lock.Extend would (a new Until, or the lock marked
// lost when it is no longer held). Locks are grouped by strategy; a strategy
// that is a BatchExtender gets one call for its whole group, any other gets
// one Extend per lock. Locks already released or lost get ErrNotHeld
// without a round trip. The result matches locks one to one.
func ExtendAll(ctx context.Context, locks []*Lock) []error {
	errs := make([]error, len(locks))
	type group struct {
		s   Strategy
		idx []int
	}
	var groups []group
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
		if reflect.TypeOf(lk.strategy).Comparable() { // == on an incomparable dynamic type panics
			for j := range groups {
				if groups[j].s == lk.strategy {
					g = j
					break
				}
			}
		}
		if g < 0 {
			groups = append(groups, group{s: lk.strategy})
			g = len(groups) - 1
		}
		groups[g].idx = append(groups[g].idx, i)
	}
	for _, grp := range groups {
		s, idx := grp.s, grp.idx
		b, ok := s.(BatchExtender)
		if !ok {
			for _, i := range idx {
				lk := locks[i]
				g, err := s.Extend(ctx, lk.fullKey, lk.token, lk.ttl)
				errs[i] = lk.applyExtension(g, err)
				lk.observeRenewal(errs[i])
			}
			continue
		}
		items := make([]Extension, len(idx))
		for j, i := range idx {
			items[j] = Extension{Key: locks[i].fullKey, Token: locks[i].token, TTL: locks[i].ttl}
		}
		out := b.ExtendBatch(ctx, items)
		for j, i := range idx {
			if j >= len(out) {
				errs[i] = fmt.Errorf("%w: strategy returned %d results for %d extensions", ErrUnavailable, len(out), len(items))
				continue
			}
			errs[i] = locks[i].applyExtension(out[j].Grant, out[j].Err)
			locks[i].observeRenewal(errs[i])
		}
	}
	return errs
}

// Do takes key (with the Locker's retry policy, like Lock), keeps it alive
// with the Locker's Keeper while fn runs, and releases it only after fn has
// returned, so that whatever fn committed is visible before anyone else can
// take the key.
//
// fn's ctx is cancelled, with the lock's error as its cause, as soon as the
// lock is known lost; fn should stop and not commit then. Do returns fn's
// error; if the lock was lost before fn returned, the error also errors.Is
// ErrLost, even if fn returned nil. Failing to obtain the lock returns the
// error of Lock and does not call fn.
//
// A failed release after fn (a node down, say) is not reported: fn's work
// was done under a valid lock, and the key expires at its TTL. A panic in fn
// stops the renewal, releases the lock and is then re-raised.
func (l *Locker) Do(ctx context.Context, key string, fn func(ctx context.Context, lk *Lock) error, opts ...LockOption) (err error) {
	if fn == nil {
		return Invalid("nil function")
	}
	lk, err := l.Lock(ctx, key, opts...)
	if err != nil {
		return err
	}
	stopKeeping := func() {}
	if l.keeper != nil {
		stopKeeping = l.keeper.Keep(lk)
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
		if lost != nil {
			err = errors.Join(err, lost)
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
