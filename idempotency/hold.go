package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redlease/redlease"
)

// hold is a run once the lock is held: it claims the record (unless the
// lock's acquisition did), runs h on a context derived from base, and
// records or releases its outcome, then releases the lock or leaves it to
// expire. base is the caller's ctx, or one detached from it (see run).
func (b *Barrier) hold(base context.Context, req Request, rec string, lk *redlease.Lock, cl *claim, h Handler, left func() bool) held {
	ctx := base
	stopKeeping := func() {}
	if b.keeper != nil {
		stopKeeping = b.keeper.Keep(lk)
	}
	keepLock := false // an unrecorded outcome, or leavesLock: the lock is left to run out
	defer func() {
		stopKeeping()
		if keepLock {
			return
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.lease)
		_ = lk.Release(rctx)
		cancel()
	}()

	// The record, again, now that we hold the lock: a request may have
	// completed while we took it. (With the lock on the store, the claim
	// was made in the same step as the lock.) The claim counts only while
	// the lock is valid, so the lock's Until is its deadline.
	var st status
	if cl != nil {
		st = cl.st
	} else {
		cctx, cancel := context.WithDeadline(ctx, lk.Until())
		var err error
		st, err = b.claim(cctx, rec, lk.Token(), lk.Fence(), req.Fingerprint)
		cancel()
		if err != nil {
			return held{v: failed, err: err}
		}
	}
	switch st.state {
	case "done":
		out, err := st.replay()
		return held{out: out, v: recorded, err: err}
	case "mismatch":
		return held{v: failed, err: ErrMismatch}
	case "progress":
		// Only a double grant gets here (an owner with a higher fence): it
		// will finish or lose its lock within a lease.
		return held{v: busy, err: &InProgressError{RetryAfter: b.lease}}
	}
	if !lk.Valid() {
		// The claim's reply came back after the lock ran out (a slow
		// store): another run may have taken the request over and be
		// running it now. Nothing runs here; the record goes back if it
		// is still ours, and the caller hears "in progress", as it would
		// have a moment later.
		_, _ = b.release(ctx, rec, lk.Token())
		return held{v: busy, err: &InProgressError{RetryAfter: time.Second}}
	}

	hctx, cancel, detach, unhook := b.handlerContext(base, lk, rec)
	defer unhook()
	defer detach()

	result, panicked, herr := b.call(hctx, h, lk.Fence())
	// Decided the moment h returned: a lock that ran out before the
	// loss was heard counts as lost too.
	if hctx.Err() == nil && !lk.Valid() {
		cancel(lostCause(lk))
	}
	var cause error
	if hctx.Err() != nil {
		cause = context.Cause(hctx)
	}
	lost := cause != nil && (errors.Is(cause, redlease.ErrLost) || !lk.Valid())
	detach()
	if panicked != nil {
		_, _ = b.release(ctx, rec, lk.Token())
		return held{panicked: panicked}
	}
	var final *FinalError
	if lost || (cause != nil && herr != nil && !errors.As(herr, &final)) {
		// Its lock was lost, or its run was cut short (Close, or the
		// Middleware's own deadline) and it returned neither a success nor
		// a Final error: its outcome is unknown, and nothing is recorded.
		// A success or a Final error returned while the lock was valid is
		// an outcome, however its ctx ended, and is recorded below.
		err := redlease.Wrap(ErrRunCancelled, herr)
		if !errors.Is(herr, cause) {
			err = redlease.Wrap(err, cause)
		}
		switch ok, rerr := b.release(ctx, rec, lk.Token()); {
		case rerr != nil:
			err = redlease.Wrap(err, rerr)
		case !ok:
			err = redlease.Wrap(err, ErrNotOwner)
		}
		return held{out: Outcome{Fence: lk.Fence()}, v: failed, err: err}
	}
	if herr != nil && !b.keep(herr) {
		_, _ = b.release(ctx, rec, lk.Token())
		return held{out: Outcome{Fence: lk.Fence()}, v: failed, err: herr}
	}
	kind, payload := "ok", result
	if herr != nil {
		kind, payload = "err", []byte(herr.Error())
	}
	if len(payload) > b.maxResult {
		kind, payload = "big", nil
	}
	out := Outcome{Result: result, Fence: lk.Fence()}
	err := b.record(ctx, rec, lk, kind, payload, left)
	// With leavesLock, the lock is left to its TTL whatever the answer:
	// a completed record answers every duplicate by itself (see
	// leavesLock), and a record taken over or gone is left as below.
	keepLock = b.leavesLock()
	switch {
	case errors.Is(err, ErrNotOwner):
		// The handler ran to completion under its lock, but the record
		// was taken over before its result was stored (the store answered
		// after the lock ran out): the effect happened and nothing says
		// so. That is "not recorded", not "taken over before anything
		// ran": the caller must not treat it as a failure to retry.
		return held{out: out, v: unrecorded, err: notRecorded(herr, err)}
	case err != nil:
		keepLock = true
		return held{out: out, v: unrecorded, err: notRecorded(herr, err)}
	}
	if kind == "big" && herr == nil {
		// The caller gets its result now; duplicates will not.
		return held{out: out, v: recorded}
	}
	return held{out: out, v: recorded, err: herr}
}

// handlerContext returns the handler's ctx, derived from base: it ends
// when the lock is lost, or when Close gives up waiting (cause ErrClosed),
// or at cancel; meanwhile the record is kept alive as long as the lock (see
// renewWhileRunning). No goroutine waits for the loss: Lock.Context hears
// it, or, for a lock on the store that no Keeper renews, which can only
// run out, one timer does (cancelAtExpiry: 13 allocations fewer per first
// request than Lock.Context, BenchmarkIdempotency case=first). Its third
// result detaches the ctx from the lock (and stops the record's renewal)
// and cancels it (nil cause), and may be called again; its fourth
// detaches the ctx from Close.
func (b *Barrier) handlerContext(base context.Context, lk *redlease.Lock, rec string) (context.Context, context.CancelCauseFunc, func(), func() bool) {
	timed := b.onStore != nil && b.keeper == nil
	lctx, stopLock := base, func() {}
	if !timed {
		lctx, stopLock = lk.Context(base)
	}
	hctx, cancel := context.WithCancelCause(lctx)
	unhook := context.AfterFunc(b.stopping, func() { cancel(context.Cause(b.stopping)) })
	var detach func()
	if timed {
		detach = b.cancelAtExpiry(cancel, lk)
	} else {
		renewing := make(chan struct{})
		go func() {
			defer close(renewing)
			b.renewWhileRunning(hctx, lk, rec)
		}()
		detach = sync.OnceFunc(func() { stopLock(); cancel(nil); <-renewing })
	}
	return hctx, cancel, detach, unhook
}

// renewWhileRunning runs beside a handler until hctx ends (the handler
// returned, its lock was lost, or Close gave up waiting): it keeps the
// in-progress record alive at least as long as the lock, so a handler
// whose lock a Keeper renews past the retention keeps its record.
// Renewals come every third of the lease or of the retention, whichever is
// shorter; one that fails is tried again at the next tick (the lock's own
// renewal decides whether the handler may go on). A lock on the store
// that no Keeper renews needs none: its record was claimed for the
// retention, which is longer than the lease, and the handler's ctx ends
// within the lease.
func (b *Barrier) renewWhileRunning(hctx context.Context, lk *redlease.Lock, rec string) {
	interval := min(b.lease, b.retention) / 3
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-hctx.Done():
			return
		case <-tick.C:
			rctx, done := context.WithTimeout(hctx, interval)
			_ = b.renewRecord(rctx, rec, lk.Token())
			done()
		}
	}
}

// cancelAtExpiry is Lock.Context for a lock on the store that no Keeper
// renews, done with one timer: nothing extends such a lock and its
// strategy revokes nothing (storeLock is no Revoker), so while the handler
// runs the lock can only be lost by its validity running out, when Valid
// turns false (its Until less the loss margin) — which is when the timer
// cancels the handler's ctx, after asking the lock itself. Nor does the
// record need renewing: it was claimed for the retention, which is longer
// than the lease, and the handler's ctx ends within the lease. stop
// stops the timer and cancels the ctx (nil cause).
func (b *Barrier) cancelAtExpiry(cancel context.CancelCauseFunc, lk *redlease.Lock) (stop func()) {
	left := func() time.Duration { return time.Until(lk.Deadline()) }
	var (
		mu      sync.Mutex
		t       *time.Timer
		stopped bool
	)
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(max(left(), 0), func() {
		if !lk.Valid() {
			cancel(lostCause(lk))
			return
		}
		// Not yet by the lock's own judgement: look again when it says.
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			t.Reset(max(left(), time.Millisecond))
		}
	})
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
		cancel(nil)
	}
}

// lostCause is why the lock is gone: an error that errors.Is
// redlease.ErrLost.
func lostCause(lk *redlease.Lock) error {
	if err := lk.Err(); err != nil {
		return err
	}
	return fmt.Errorf("%w: the lock's validity ran out", redlease.ErrLost)
}
