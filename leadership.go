package redlease

import (
	"context"
	"errors"
	"sync"
	"time"
)

// Leadership is one term of an election won by Campaign: the lock on the
// election's key, kept alive by the Locker's keeper, and the value
// recorded beside it. Its methods are safe for concurrent use, and on a
// nil *Leadership (which leads nothing: Proclaim and Resign return
// ErrNotHeld, Lost is closed, Term is 0).
//
// A Leadership moves one way: leading → resigned, or leading → lost. Once
// Lost is closed it never leads again; campaign anew for a new term.
type Leadership struct {
	e           *Election
	el          Elector
	lk          *Lock
	stopKeeping func()

	mu    sync.Mutex
	value string

	once sync.Once     // ends the record's refresh
	stop chan struct{} // closed to end refresh
	done chan struct{} // closed when refresh has returned
}

// Term returns the leadership's term: its lock's fence, strictly above
// every earlier leader's term of the election (under the strategy's
// assumptions). Pass it to storage that refuses writes with a term below
// the highest it accepted: a deposed leader's writes are then refused.
func (ld *Leadership) Term() uint64 {
	if ld == nil {
		return 0
	}
	return ld.lk.Fence()
}

// Value returns the value this leader last recorded.
func (ld *Leadership) Value() string {
	if ld == nil {
		return ""
	}
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.value
}

// Lock returns the lock behind the leadership: its Until, Deadline and
// Token. Release it through Resign, not directly.
func (ld *Leadership) Lock() *Lock {
	if ld == nil {
		return nil
	}
	return ld.lk
}

// Lost returns a channel that is closed once this process stops leading:
// the lock is lost (a renewal found it gone, its validity ran out, a
// Proclaim found another holder) or the leader resigned (see Lock.Lost).
func (ld *Leadership) Lost() <-chan struct{} { return ld.Lock().Lost() }

// Err returns nil while leading (or after a clean Resign), and an error
// that errors.Is ErrLost once the leadership is lost (see Lock.Err).
func (ld *Leadership) Err() error { return ld.Lock().Err() }

// Context returns a copy of parent that is cancelled once Lost closes,
// with Err as its cause (see Lock.Context). Run the leader's work under
// it; stop detaches it.
func (ld *Leadership) Context(parent context.Context) (ctx context.Context, stop func()) {
	return ld.Lock().Context(parent)
}

// Proclaim records value as the leader's, and publishes it to observers,
// without an election: in one atomic step on the key's node, and only if
// the key still holds this leader's token, so that a deposed leader can
// never overwrite a newer leader's value. It is refused with an error that
// errors.Is ErrNotHeld once the leadership is resigned or lost (ErrLost
// too when lost), or when the node says the key is no longer this
// leader's, which also marks the leadership lost. It is bounded by the
// strategy's call bound or ctx.
func (ld *Leadership) Proclaim(ctx context.Context, value string) error {
	if ld == nil {
		return ErrNotHeld
	}
	if err := ld.proclaim(ctx, value, true); err != nil {
		return err
	}
	ld.mu.Lock()
	ld.value = value
	ld.mu.Unlock()
	return nil
}

// proclaim writes value (write) or refreshes the record, under the lock.
func (ld *Leadership) proclaim(ctx context.Context, value string, write bool) error {
	lk := ld.lk
	lk.mu.Lock()
	err := lk.usableLocked()
	lk.unlockMu()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, ld.e.bound)
	defer cancel()
	err = ld.el.Proclaim(ctx, lk.fullKey, lk.token, lk.fence, value, lk.TTL(), write)
	if errors.Is(err, ErrNotHeld) {
		lk.markLost(err)
		return Wrap(ErrNotHeld, lk.Err())
	}
	return err
}

// refresh keeps the leader's record alive as long as its lock, a third
// of the lock's TTL at a time, until Resign or the loss.
func (ld *Leadership) refresh() {
	defer close(ld.done)
	t := time.NewTimer(refreshEvery(ld.lk))
	defer t.Stop()
	lost := ld.lk.Lost()
	for {
		select {
		case <-ld.stop:
			return
		case <-lost:
			return
		case <-t.C:
		}
		_ = ld.proclaim(context.Background(), "", false)
		t.Reset(refreshEvery(ld.lk))
	}
}

// refreshEvery is the interval of a leader's record refresh: a third of
// its lock's TTL, at least a millisecond.
func refreshEvery(lk *Lock) time.Duration { return max(lk.TTL()/3, time.Millisecond) }

// Resign gives the leadership up: it stops renewing, and releases the
// election's key (Lock.Release: the leadership ends, and Lost closes, as
// the release is sent), which wakes the next campaigner; then it waits
// for the record's refresh goroutine, which ends with the release. The
// leader's record stays until it expires, but no longer counts: Leader
// reports no leader once the key is gone. It returns the release's error
// (ErrNotHeld: the leadership had already been lost).
func (ld *Leadership) Resign(ctx context.Context) error {
	if ld == nil {
		return ErrNotHeld
	}
	return ld.resign(ctx)
}

func (ld *Leadership) resign(ctx context.Context) error {
	ld.once.Do(func() { close(ld.stop) })
	ld.stopKeeping()
	// The hold ends as the release is sent (Lost closes then), not after
	// a refresh still in flight: that one compares the token, and the
	// refresh goroutine is joined after.
	err := ld.lk.Release(ctx)
	<-ld.done
	return err
}
