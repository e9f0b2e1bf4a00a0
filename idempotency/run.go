package idempotency

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redlease/redlease"
)

// run takes the lock, claims the record and runs h. With the lock on the
// store, the lock's acquisition also reads and claims the record (the
// claim is its script, see storeLock), and a request found done or
// refused comes back as errSettled, with the record's state in the claim.
//
// With detach (Do, DoWait, the Consumer), everything after the lock's
// acquisition (see hold) runs on a context detached from ctx: ctx's end
// does not cut the handler short, nor decide its record. If ctx ends
// first, run returns at once with ctx's error while the run goes on in a
// goroutine the Barrier owns (see Close). Without detach (the Middleware,
// whose ctx is its own: its handler timeout), h runs on ctx itself.
func (b *Barrier) run(ctx context.Context, req Request, rec, lockKey string, h Handler, detach bool) (Outcome, verdict, error) {
	var (
		cl  *claim
		lk  *redlease.Lock
		err error
	)
	if b.onStore != nil {
		cl = &claim{s: b.onStore, rec: rec, fp: req.Fingerprint}
		lk, err = b.locker.TryLock(ctx, lockKey, claimOption(cl))
	} else {
		lk, err = b.locker.TryLock(ctx, lockKey)
	}
	if errors.Is(err, errSettled) && cl.st.settled() {
		return cl.st.answer()
	}
	var nodeErr *redlease.NodeError
	refused := errors.Is(err, redlease.ErrNotObtained) && !errors.As(err, &nodeErr)
	if refused && (ctx.Err() == nil || heldByAnother(err)) {
		// Taken, not failed: someone is running this request now, or has
		// just finished it. That holds whether or not ctx ended while the
		// store answered: a refusal that says another token holds the
		// lock is the store's answer, not ctx's doing. With a lock that is
		// not on the store, the look at the record (exec's peek) and the
		// lock are two steps, and the request may have completed between
		// them (on quorum, its lock's release may still be landing on some
		// nodes). A second look answers a completed request with its
		// result, and a payload that differs with ErrMismatch; only an
		// unsettled record gets "in progress".
		if b.onStore == nil {
			if st, perr := b.peek(ctx, rec, req.Fingerprint); perr == nil && st.settled() {
				return st.answer()
			}
		}
		return Outcome{}, busy, &InProgressError{RetryAfter: time.Second}
	}
	if refused {
		// ctx ended, and the refusal does not say that another token holds
		// the lock (the grant came back with no validity left, and was
		// undone; the attempt gave up at ctx): nothing runs, and the
		// caller gets its ctx's error, with what the lock said.
		return Outcome{}, failed, triedUntilCtxEnded(ctx, err)
	}
	if err != nil {
		return Outcome{}, failed, err
	}
	if err := b.enter(); err != nil {
		// Closed while the lock was taken: nothing runs, and what this
		// attempt took goes back.
		if cl != nil {
			_, _ = b.release(ctx, rec, lk.Token())
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.lease)
		_ = lk.Release(rctx)
		cancel()
		return Outcome{}, failed, err
	}
	if !detach || ctx.Done() == nil {
		// A ctx that never ends needs no goroutine to be left behind.
		base := ctx
		if detach {
			base = context.WithoutCancel(ctx)
		}
		defer b.leave()
		r := b.hold(base, req, rec, lk, cl, h, nil)
		if r.panicked != nil {
			panic(r.panicked)
		}
		return r.out, r.v, r.err
	}
	f := &flight{done: make(chan held, 1)}
	go func() {
		defer b.leave()
		f.deliver(b.hold(context.WithoutCancel(ctx), req, rec, lk, cl, h, f.gone))
	}()
	select {
	case r := <-f.done:
		return r.result()
	case <-ctx.Done():
	}
	if r, ok := f.leave(); ok {
		return r.result()
	}
	return Outcome{Fence: lk.Fence()}, failed, callerLeft(ctx)
}

// held is what became of a run that held the lock (see hold); a panic of
// the handler's is carried to whoever waits for it.
type held struct {
	out      Outcome
	v        verdict
	err      error
	panicked any
}

// result is r's answer, re-raising the handler's panic.
func (r held) result() (Outcome, verdict, error) {
	if r.panicked != nil {
		panic(r.panicked)
	}
	return r.out, r.v, r.err
}

// flight hands a detached run's answer to its caller, if the caller still
// waits: a caller that left (its ctx ended) takes nothing, and a panic of
// the handler's then goes on in the run's goroutine, as any unrecovered
// panic does.
type flight struct {
	mu   sync.Mutex
	left bool
	done chan held // buffered: one answer
}

// deliver gives r to the caller, or, if it left, re-raises the handler's
// panic.
func (f *flight) deliver(r held) {
	f.mu.Lock()
	left := f.left
	if !left {
		f.done <- r
	}
	f.mu.Unlock()
	if left && r.panicked != nil {
		panic(r.panicked)
	}
}

// gone reports whether the caller has left (leave).
func (f *flight) gone() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.left
}

// leave marks the caller gone, unless the answer came meanwhile (ok).
func (f *flight) leave() (r held, ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	select {
	case r = <-f.done:
		return r, true
	default:
		f.left = true
		return held{}, false
	}
}

// heldByAnother reports whether a refused acquisition says that another
// token holds the lock: one node's refusal with the holder's TTL
// (*redlease.HeldError), or a quorum's refusals alone ruling the quorum
// out (no node unavailable, no grant that came back too late).
func heldByAnother(err error) bool {
	var he *redlease.HeldError
	if errors.As(err, &he) {
		return true
	}
	var qe *redlease.QuorumError
	return errors.As(err, &qe) && !qe.Unavailable && !qe.Expired
}

// call runs h, turning a panic into a value so the record can be released
// before it is re-raised.
func (b *Barrier) call(ctx context.Context, h Handler, fence uint64) (res []byte, panicked any, err error) {
	defer func() {
		if p := recover(); p != nil {
			panicked = p
		}
	}()
	res, err = h(ctx, fence)
	return res, nil, err
}

// keep decides whether a failed handler's outcome is stored: Final errors
// (definitive business outcomes) yes; everything else no, unless
// WithStoreEverything — and even then not a handler's own ErrInProgress
// (transient by nature), an error that says a lock was lost (the run may
// not have been exclusive), nor a Middleware's response with a status it
// does not record (*unrecordedStatus: the Middleware's own rule, which the
// Barrier's option does not override). A run whose lock was lost never gets
// here, nor one cut short (by Close) that returned a non-Final error
// (ErrRunCancelled).
func (b *Barrier) keep(err error) bool {
	var (
		f *FinalError
		u *unrecordedStatus
	)
	switch {
	case errors.As(err, &u):
		return false
	case errors.As(err, &f):
		return true
	case errors.Is(err, ErrInProgress), errors.Is(err, redlease.ErrLost):
		return false
	}
	return b.storeAll
}
