package redlease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redlease/redlease/internal/locktoken"
)

// LockSet is several keys held at once: one Lock per key, taken by
// LockAll, TryLockAll or DoAll in one atomic step where the strategy can
// (see LockAll), otherwise in one order that every caller shares (the
// keys as sent to Redis, byte by byte), held together and released
// together. Each key is a lock of its own on the strategy's nodes, with its
// own fence and its own Until: on a quorum each key needs its own majority.
// The set is only as held as its least held lock: Valid, Until and Lost
// answer for the set as a whole. Its methods are safe for concurrent use.
type LockSet struct {
	locks []*Lock // in the order taken

	lostOnce sync.Once
	lost     context.Context // Lost's: cancelled once any lock's Lost closes
	lostNow  context.CancelFunc
}

// Keys returns the keys as given (without the Locker's prefix), in the
// order they were taken.
func (s *LockSet) Keys() []string {
	keys := make([]string, len(s.locks))
	for i, lk := range s.locks {
		keys[i] = lk.Key()
	}
	return keys
}

// Locks returns the set's locks, in the order they were taken (a copy of
// the slice; the Locks are the set's own). Extending or releasing one of
// them alone makes the set as held as that lock.
func (s *LockSet) Locks() []*Lock { return slices.Clone(s.locks) }

// Lock returns the lock of key (as given to LockAll, without the Locker's
// prefix), or nil if key is not one of the set's.
func (s *LockSet) Lock(key string) *Lock {
	for _, lk := range s.locks {
		if lk.Key() == key {
			return lk
		}
	}
	return nil
}

// Fence returns the fencing token of key's lock (see Lock.Fence), 0 if key
// is not one of the set's. Pass each key's own fence to the storage of
// that key.
func (s *LockSet) Fence(key string) uint64 { return s.Lock(key).Fence() }

// Until returns the earliest Until of the set's locks: until then, and no
// longer, every key of the set is held.
func (s *LockSet) Until() time.Time {
	var until time.Time
	for i, lk := range s.locks {
		if u := lk.Until(); i == 0 || u.Before(until) {
			until = u
		}
	}
	return until
}

// Valid reports whether every lock of the set is still valid (Lock.Valid).
func (s *LockSet) Valid() bool {
	for _, lk := range s.locks {
		if !lk.Valid() {
			return false
		}
	}
	return true
}

// Err returns nil while no lock of the set was lost, and otherwise the
// error of the first one taken that was (Lock.Err: it errors.Is ErrLost
// and names its key).
func (s *LockSet) Err() error {
	for _, lk := range s.locks {
		if err := lk.Err(); err != nil {
			return err
		}
	}
	return nil
}

// Lost returns a channel that is closed once any lock of the set is lost
// or released (the first of their Lost channels): from then on the set is
// not this process's to use. No goroutine waits for it; each lock's timer
// and a context callback do, as for Lock.Lost.
func (s *LockSet) Lost() <-chan struct{} {
	s.lostOnce.Do(func() {
		s.lost, s.lostNow = context.WithCancel(context.Background())
		for _, lk := range s.locks {
			lk.afterEnd(s.lostNow)
		}
	})
	return s.lost.Done()
}

// Context returns a copy of parent that is cancelled once any lock of the
// set ends (Lost), with that lock's Err as its cause, as Lock.Context does
// for one lock. stop cancels the copy and detaches it from the locks; it
// returns once a cancellation by a lock already under way has finished.
func (s *LockSet) Context(parent context.Context) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	detach := make([]func() bool, len(s.locks))
	told := make([]chan struct{}, len(s.locks))
	for i, lk := range s.locks {
		told[i] = make(chan struct{})
		detach[i] = lk.afterEnd(func() {
			defer close(told[i])
			cancel(lk.Err())
		})
	}
	return ctx, func() {
		for i := range detach {
			if !detach[i]() {
				<-told[i] // the loss (or the release) is being told: let it finish
			}
		}
		cancel(nil)
	}
}

// Extend extends every lock of the set to ttl (Lock.Extend), all at once.
// It returns nil if every extension succeeded, and otherwise every
// failure joined (errors.Is sees each; each names its key). A lock whose
// extension failed is as Lock.Extend leaves it, and the set is then only
// as held as that lock.
func (s *LockSet) Extend(ctx context.Context, ttl time.Duration) error {
	return s.each(func(lk *Lock) error { return lk.Extend(ctx, ttl) })
}

// Release releases every lock of the set (Lock.Release), all at once. The
// hold of the whole set ends when Release is called. It returns nil if
// every release was confirmed, and otherwise every failure joined: one
// that errors.Is ErrNotHeld means that key had already expired or been
// taken over, and work done under the set may not have been exclusive.
func (s *LockSet) Release(ctx context.Context) error {
	return s.each(func(lk *Lock) error { return lk.Release(ctx) })
}

// each runs f on every lock at once (the last on the caller's goroutine)
// and joins the errors, each with its key.
func (s *LockSet) each(f func(lk *Lock) error) error {
	errs := make([]error, len(s.locks))
	run := func(i int) {
		if err := f(s.locks[i]); err != nil {
			errs[i] = fmt.Errorf("key %q: %w", s.locks[i].Key(), err)
		}
	}
	var wg sync.WaitGroup
	for i := range len(s.locks) - 1 {
		wg.Go(func() { run(i) })
	}
	if n := len(s.locks); n > 0 {
		run(n - 1)
	}
	wg.Wait()
	return errors.Join(errs...)
}

// TryLockAll makes one attempt at the set and returns every key held, or
// none. Where the strategy can take the keys in one atomic step (see
// "One step" under LockAll) that step is the attempt, and nothing is
// written unless every key is free. Otherwise it makes one attempt at
// each key, in the set's order (see LockSet): at the first key it cannot
// take it releases the keys it took (as LockAll does). Either way it
// returns the error of the first key refused (errors.Is as TryLock's:
// ErrNotObtained, ErrUnavailable, ...; the message names the key). keys
// must not be empty nor name a key twice (ErrInvalid). It never waits
// for a holder.
func (l *Locker) TryLockAll(ctx context.Context, keys []string, opts ...LockOption) (*LockSet, error) {
	set, stop, err := l.takeAll(ctx, keys, opts, false, false)
	stop()
	return set, err
}

// LockAll takes every key, waiting for each as Lock does, and returns them
// all held, or none. It takes the keys one after another in one order that
// every caller shares: their names as sent to Redis (with the Locker's
// prefix), byte by byte. So two calls whose sets overlap never wait for
// each other in a cycle, whatever order their keys were given in: two
// transfers in opposite directions between the same two accounts do not
// deadlock. That holds among sets taken with LockAll, TryLockAll and
// DoAll; a caller that holds a key by Lock while it asks LockAll for
// another can still wait in a cycle with a set that holds the other.
//
// While it waits for a key, the keys it already holds are kept alive by
// the Locker's Keeper, as Do's lock is (WithKeeper; the process-wide
// default watchdog; nothing with WithoutKeeper), and LockAll stops
// keeping them before it returns: extend the set (LockSet.Extend, a
// renew.Watchdog) or use DoAll. Each key keeps the validity its grant or
// last renewal gave it, so the set's Until is its earliest. If a key
// already taken is lost while LockAll waits for a later one (a renewal
// found it not held, or none succeeded in time), LockAll releases the
// others and returns that loss (errors.Is ErrLost).
//
// One step: where the strategy is a SetAcquirer whose Together accepts
// the keys (single and failover, on one server; on a Cluster client,
// keys in one hash slot: give them one hash tag, "{acct}:1",
// "{acct}:2"), and the call is neither fair (WithFairness: each key's
// line is honoured, one key at a time) nor fused, LockAll's first
// attempt takes every key in one atomic step and one round trip, or
// writes nothing: a set whose keys are free is held at once, without
// holding one key while it asks for the next. If that step is refused
// (or nothing decided it), LockAll goes on in the set's order as above;
// the step counts as every key's first attempt (WithMaxAttempts(1): it
// is the only one). The locks of a set taken in one step share one
// token (Lock.Token) and one Until, each key with its own fence.
//
// On any failure it releases the keys it took, each within the
// strategy's call bound (as Do's release; in the background when ctx has
// a deadline or is done, so that LockAll returns by ctx's deadline), and
// returns the failing key's
// error, as Lock would return it (ctx, ErrNotObtained, ErrUnavailable,
// ...), naming the key. keys must not be empty nor name a key twice
// (ErrInvalid). Options apply to every key (WithTTL, WithFairness, ...);
// WithMaxAttempts counts per key.
func (l *Locker) LockAll(ctx context.Context, keys []string, opts ...LockOption) (*LockSet, error) {
	set, stop, err := l.takeAll(ctx, keys, opts, true, false)
	stop()
	return set, err
}

// DoAll is Do for a set of keys: it takes them as LockAll does, keeps them
// alive while fn runs, and releases them only after fn returned. fn's ctx
// is cancelled, with the lost lock's error as its cause, as soon as any
// key of the set is known lost; fn should stop and not commit then. DoAll
// returns fn's error, and the loss as well (errors.Is ErrLost) if a key
// was lost before fn returned. Failing to take the set returns LockAll's
// error and does not call fn. What Do documents about its keeper, its
// release and a panic in fn holds for every key.
func (l *Locker) DoAll(ctx context.Context, keys []string, fn func(ctx context.Context, set *LockSet) error, opts ...LockOption) (err error) {
	if fn == nil {
		return Invalid("nil function")
	}
	set, stopKeeping, err := l.takeAll(ctx, keys, opts, true, true)
	if err != nil {
		stopKeeping()
		return err
	}
	fnCtx, stopCtx := set.Context(ctx)
	defer func() {
		stopCtx()
		stopKeeping()
		lost := set.Err() // read before Release: a set released in time is not lost
		releaseAll(ctx, set.locks)
		err = withLoss(err, lost)
	}()
	return fn(fnCtx, set)
}

// takeAll takes keys in the set's order, waiting for each (wait) or one
// attempt each, keeping the keys taken alive while it waits for later ones
// (and after it returns, with keepAfter: the returned stop ends that). On
// failure it releases what it took and returns a nil set.
func (l *Locker) takeAll(ctx context.Context, keys []string, opts []LockOption, wait, keepAfter bool) (set *LockSet, stop func(), err error) {
	stop = func() {}
	if len(keys) == 0 {
		return nil, stop, Invalid("no keys")
	}
	items := make([]setItem, len(keys))
	for i, key := range keys {
		c, err := l.config(key, opts)
		if err != nil {
			return nil, stop, fmt.Errorf("key %q: %w", key, err)
		}
		items[i] = setItem{key, c}
	}
	// One order for every caller: the names as sent to Redis. (All keys
	// of one call share the Locker's prefix; comparing the full names
	// keeps the order that of another Locker whose prefix differs.)
	slices.SortFunc(items, func(a, b setItem) int {
		return cmp.Compare(l.prefix+a.key, l.prefix+b.key)
	})
	for i := 1; i < len(items); i++ {
		if items[i].key == items[i-1].key {
			return nil, stop, Invalid("key %q given twice", items[i].key)
		}
	}

	var keeper Keeper
	if wait || keepAfter {
		keeper = l.keeperFor(items[0].c)
	}
	locks := make([]*Lock, 0, len(items))
	stops := make([]func(), 0, len(items))
	stopAll := func() {
		for _, s := range stops {
			s()
		}
	}
	if sa, full := l.together(items); sa != nil {
		c := items[0].c
		// One atomic step for the whole set: every key, or none.
		together, err := l.attemptSet(ctx, c, sa, items, full)
		switch {
		case err == nil:
			locks = together
			if keeper != nil && keepAfter {
				for _, lk := range locks {
					stops = append(stops, keeper.Keep(lk))
				}
			}
			return &LockSet{locks: locks}, stopAll, nil
		case !wait || c.maxAttempts == 1 || !(errors.Is(err, ErrNotObtained) || errors.Is(err, ErrUnavailable)) || ctx.Err() != nil:
			return nil, stop, err
		}
		// Refused (or nothing decided): the set's order from here, each
		// key waited for as Lock waits; this attempt was each key's
		// first.
		if c.maxAttempts > 1 {
			for i := range items {
				items[i].c.maxAttempts--
			}
		}
	}
	fail := func(key string, err error) (*LockSet, func(), error) {
		stopAll()
		if cleanupInBackground(ctx) {
			// The releases must not hold the caller past its deadline:
			// they finish in the background, each within its bound.
			go releaseAll(ctx, locks)
		} else {
			releaseAll(ctx, locks)
		}
		return nil, func() {}, fmt.Errorf("key %q of %d: %w", key, len(items), err)
	}
	for _, it := range items {
		var lk *Lock
		var err error
		if wait {
			lk, err = l.wait(ctx, it.c, it.key)
		} else {
			lk, err = l.try(ctx, it.c, it.key)
		}
		if err != nil {
			return fail(it.key, err)
		}
		locks = append(locks, lk)
		if keeper != nil {
			stops = append(stops, keeper.Keep(lk))
		}
	}
	// A key taken first may have been lost while a later one was waited
	// for: the set is then not held as a whole.
	for _, lk := range locks {
		if err := lk.Err(); err != nil || !lk.Valid() {
			if err == nil {
				err = fmt.Errorf("%w: its validity ran out while a later key was waited for", ErrLost)
			}
			return fail(lk.Key(), err)
		}
	}
	set = &LockSet{locks: locks}
	if !keepAfter {
		stopAll()
		return set, func() {}, nil
	}
	return set, stopAll, nil
}

// setItem is a key of a set being taken, with its call's config.
type setItem struct {
	key string
	c   lockConfig
}

// together returns the strategy as a SetAcquirer, and the keys' names as
// sent to Redis, if the set's keys (items, in the set's order) can be
// taken in one atomic step: the strategy is a SetAcquirer whose Together
// accepts those names, and the call is neither fair (one line per key; a
// set that jumps them would be unfair) nor fused. Otherwise sa is nil.
func (l *Locker) together(items []setItem) (sa SetAcquirer, full []string) {
	c := items[0].c
	sa, ok := c.strategy.(SetAcquirer)
	if !ok || c.fair || c.fused != nil || len(items) < 2 {
		return nil, nil
	}
	full = make([]string, len(items))
	for i, it := range items {
		full[i] = l.prefix + it.key
	}
	if !sa.Together(full) {
		return nil, nil
	}
	return sa, full
}

// attemptSet makes one attempt at every key of items (in the set's order;
// full: their names as sent to Redis) in one atomic step on sa, under one
// token, and returns their locks, or
// the error: a refusal names the key refused (the first held, in the
// set's order), as the set's order does. It is attempt for a set: every
// lock is tracked by a Revoker from before the request, and a set that
// came back with less validity than the loss margin is released and
// counts as not obtained.
func (l *Locker) attemptSet(ctx context.Context, c lockConfig, sa SetAcquirer, items []setItem, full []string) ([]*Lock, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("key %q of %d: %w", items[0].key, len(items), Wrap(ErrNotObtained, context.Cause(ctx)))
	}
	names := make([]string, len(items))
	for i, it := range items {
		names[i] = it.key
	}
	token := attemptToken(locktoken.New(ctx, full[0]), 1)
	trs := make([]*tracking, len(items))
	untrackAll := func() {
		for _, tr := range trs {
			if tr != nil {
				tr.untrack()
			}
		}
	}
	if r, ok := c.strategy.(Revoker); ok {
		for i := range items {
			trs[i] = &tracking{}
			trs[i].untrack = r.Track(full[i], token, trs[i].revoke)
		}
	}
	actx, done := observe(ctx, l.observer, Op{Name: "acquire_set", Strategy: strategyName(c.strategy), Key: strings.Join(names, ","), Keys: names})
	grants, at, err := sa.AcquireSet(actx, full, token, c.ttl)
	done(err)
	if err != nil {
		untrackAll()
		key := items[0].key
		if at >= 0 && at < len(items) {
			key = items[at].key
		}
		return nil, fmt.Errorf("key %q of %d: %w", key, len(items), err)
	}
	if len(grants) != len(items) {
		untrackAll()
		return nil, fmt.Errorf("%w: the strategy's AcquireSet returned %d grants for %d keys", ErrUnavailable, len(grants), len(items))
	}
	now := time.Now()
	locks := make([]*Lock, len(items))
	for i, it := range items {
		lk := newLock(c.strategy, it.key, full[i], token, c.ttl, c.lossMargin(), grants[i])
		lk.observer, lk.granted, lk.clock = l.observer, now, l.clock
		if trs[i] != nil {
			trs[i].attach(lk)
		}
		locks[i] = lk
	}
	for i, lk := range locks {
		if !lk.Valid() {
			// Born lost (see attempt): the set goes back, by this
			// attempt's token, within the loss margin and the caller's
			// deadline, and counts as not obtained.
			cause := lk.Err()
			rctx, cancel := bornLostBound(ctx, c)
			_ = (&LockSet{locks: locks}).each(func(lk *Lock) error { return lk.Release(rctx) })
			cancel()
			return nil, fmt.Errorf("key %q of %d: %w", items[i].key, len(items), Wrap(ErrNotObtained, cause))
		}
	}
	return locks, nil
}

// releaseAll releases locks at once, each within Do's release bound
// (releaseBound), whatever ctx says: keys taken for a set that failed, or
// a DoAll's after fn. A failure is not reported: the key expires at its
// TTL.
func releaseAll(ctx context.Context, locks []*Lock) {
	if len(locks) == 0 {
		return
	}
	s := &LockSet{locks: locks}
	_ = s.each(func(lk *Lock) error {
		relCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseBound(lk))
		defer cancel()
		return lk.Release(relCtx)
	})
}
