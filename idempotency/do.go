package idempotency

import (
	"context"
	"time"

	"github.com/redlease/redlease"
)

// Outcome is what Do returns for a request.
type Outcome struct {
	Result   []byte // the handler's result, or the stored one
	Replayed bool   // the result is a stored one: the handler did not run now
	Fence    uint64 // the fence the handler ran under (0 on a replay)
}

// Handler does the request's work under the lock. Its ctx carries the
// caller's values but not its cancellation (Do, DoWait and the Consumer;
// the Middleware's is its own, see Middleware): it is cancelled when the
// lock is lost, or when Close gives up waiting for it. If the lock was
// lost when it returns, whatever it returned is discarded and the request
// released; if Close cancelled it, a success or a Final error it returns
// while its lock is valid is recorded, and any other error releases the
// request (see ErrRunCancelled). fence is the fence of this
// request's lock: it orders the runs of this one request (a takeover gets
// a higher fence), so storage written only by this request can refuse a
// stale run with it — but a run cut short may have made its effect, and
// the retry that follows comes with a higher fence, which such storage
// accepts: storage must also key the effect by the request (a unique
// request or payment id), so that the retry finds it made. It says
// nothing about other requests: a shared row (an account balance) needs its
// own lock and that lock's fence — see examples/settlement.
type Handler func(ctx context.Context, fence uint64) ([]byte, error)

// Request identifies one request: Key names it (see Key), Fingerprint is
// the payload's (see Fingerprint), empty if payloads need not match.
type Request struct {
	Key         string
	Fingerprint string
}

// Do runs h once for req.Key. See Barrier for what duplicates get. The
// error is h's (a stored failure is replayed as a *StoredError), or
// ErrInProgress, ErrMismatch, ErrNotOwner, ErrResultNotStored,
// ErrRunCancelled, ErrNotRecorded, or a lock or store failure.
//
// ctx bounds the wait, not the run: once the lock is held, h runs on a
// context detached from ctx (its values kept), and its outcome is
// recorded whatever becomes of ctx, for as long as the request's lock is
// held (at most a lease). If ctx ends first, Do returns at once with an
// error that wraps ctx's error (and cause): h goes on in the background,
// owned by the Barrier (Close waits for it, and at the end of its grace
// cancels it), and a retry gets ErrInProgress until its outcome is
// recorded, then the outcome. An outcome that is not recorded lets a later
// retry run h again. If ctx ends while the lock is being tried, the
// store's answer decides: "held by another" is ErrInProgress, as it would
// be with ctx live; any other refusal wraps ctx's error (h did not run).
func (b *Barrier) Do(ctx context.Context, req Request, h Handler) (Outcome, error) {
	return b.do(ctx, nsRequest, req, h, 0)
}

// DoWait is Do, but a duplicate that finds the request in progress waits
// up to wait for it to complete and replays its result (ErrInProgress if it
// does not complete in time). Only the Barrier's own in-progress answer is
// waited on: an ErrInProgress that h returns (a nested Barrier, a
// downstream 409) is h's result, a transient failure, returned at once.
func (b *Barrier) DoWait(ctx context.Context, req Request, wait time.Duration, h Handler) (Outcome, error) {
	return b.do(ctx, nsRequest, req, h, wait)
}

// verdict says what became of a request, for the callers that act on it
// (do waits on busy, the Consumer acks recorded and unrecorded) without
// reading it from the error, which may wrap a handler's own sentinels.
type verdict int

const (
	// failed: nothing is recorded — the request was refused, not run, or
	// run and released (a transient failure, a cancelled run, a result
	// refused because the record was taken over). A retry may run it.
	failed verdict = iota
	// busy: the Barrier's own in-progress answer (the lock is taken, or
	// the record is in progress under a higher fence).
	busy
	// recorded: run now or before, and its outcome is on the record (or
	// it completed with a result too large to keep).
	recorded
	// unrecorded: run now, but its outcome could not be recorded
	// (ErrNotRecorded): its effect may have happened.
	unrecorded
)

// do runs h once for req.Key in namespace ns (see keys.go): Do and DoWait,
// the Consumer and the Middleware each have their own.
func (b *Barrier) do(ctx context.Context, ns string, req Request, h Handler, wait time.Duration) (Outcome, error) {
	out, _, err := b.exec(ctx, ns, req, h, wait)
	return out, err
}

// exec is do, and says what became of the request.
func (b *Barrier) exec(ctx context.Context, ns string, req Request, h Handler, wait time.Duration) (Outcome, verdict, error) {
	if req.Key == "" {
		return Outcome{}, failed, permanent{redlease.Invalid("idempotency: empty key")}
	}
	if h == nil {
		return Outcome{}, failed, redlease.Invalid("idempotency: nil handler")
	}
	rec := b.recordKey(ns, req.Key)
	deadline := time.Now().Add(wait)
	for attempt := 0; ; attempt++ {
		// Cheap first look: most duplicates are replays, and need no lock.
		// With the lock on the store, the look is part of run's claim.
		st := status{state: "none"}
		if b.onStore == nil {
			var err error
			if st, err = b.peek(ctx, rec, req.Fingerprint); err != nil {
				return Outcome{}, failed, err
			}
		}
		if st.settled() {
			return st.answer()
		}
		// None, or in progress: whoever holds the lock is running it. An
		// in-progress record whose owner's lock has expired (a crash, a
		// pause) is taken over by whoever gets the lock next.
		out, v, err := b.run(ctx, req, rec, lockKey(ns, req.Key), h, ns != nsHTTP)
		// Only the Barrier's own in-progress answer is waited on: an
		// ErrInProgress of the handler's is its result.
		if v != busy || time.Now().After(deadline) {
			return out, v, err
		}
		// Waiting for an in-flight duplicate: poll, bounded by the deadline.
		if err := sleepCtx(ctx, min(50*time.Millisecond*time.Duration(attempt+1), time.Until(deadline), 500*time.Millisecond)); err != nil {
			return Outcome{}, failed, err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
