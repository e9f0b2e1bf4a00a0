package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redlease/redlease"
)

// Errors a caller can check with errors.Is.
var (
	// ErrInProgress: the same request is being handled right now by someone
	// else. Try again later (HTTP 409 with Retry-After; MQ: do not ack).
	ErrInProgress = errors.New("idempotency: request in progress")
	// ErrMismatch: the key was first used with a different payload.
	ErrMismatch = errors.New("idempotency: key reused with a different payload")
	// ErrNotOwner: the in-progress record belongs to another owner (the
	// caller's lock expired and someone took the request over); its result was not
	// stored. When the handler had already run, Do wraps it in
	// ErrNotRecorded (the effect may have happened).
	ErrNotOwner = errors.New("idempotency: record taken over by another owner")
	// ErrResultNotStored: the request completed, but its result was larger
	// than the limit and was not kept; it will not run again.
	ErrResultNotStored = errors.New("idempotency: request completed; result too large to replay")
	// ErrRunCancelled: the handler's run was cut short, so its outcome is
	// unknown and was not recorded: its lock was lost (whatever it
	// returned), or its context was cancelled by Close (or, in the
	// Middleware, by its handler timeout) and it returned an error that is
	// not Final. The record was released and a retry will run the handler
	// again, under a higher fence: the handler's own storage must key its
	// effect by the request (its key), not only by the fence, or the
	// retry repeats an effect the cut-short run made. The error also wraps
	// the handler's error and the context's cause (context.Cause: an error
	// that errors.Is redlease.ErrLost when the lock was lost, ErrClosed
	// when Close cancelled it). A caller's own ctx never cuts a run short
	// (see Do).
	ErrRunCancelled = errors.New("idempotency: run cancelled; outcome unknown, not recorded")
	// ErrNotRecorded: the handler ran and its effect may have happened, but
	// its result could not be recorded (the store failed for a lease after
	// the handler returned, or for as long as the request's lock was
	// valid, if that was shorter). Do not treat it as a failure to retry:
	// the Outcome still carries the handler's result and fence, and the
	// error wraps the handler's error (if any) and the store's. The record
	// stays in progress under this owner until its lock runs out, after
	// which a retry takes the request over and runs it again (at once, if
	// the store lost the record itself).
	ErrNotRecorded = errors.New("idempotency: result not recorded")
)

// Permanent reports whether err refuses the request itself, so that no
// retry of it can ever succeed: its key was first used with a different
// payload (ErrMismatch), or it has no key (an empty request key or message
// id, which also errors.Is redlease.ErrInvalid). A Consumer given ack
// false and a permanent error should dead-letter the message (move it
// aside for a person, and ack it): redelivered, it fails the same way
// forever. A handler's error that wraps ErrMismatch (a nested Barrier's)
// counts too.
//
// Everything else is not permanent, nil included: ErrInProgress, a
// handler's failure, ErrRunCancelled, store and lock failures — and
// redlease.ErrInvalid from the program rather than the request (a nil
// handler, a lock strategy that refuses the lease): that is a bug or a
// misconfiguration to fix, after which the same message goes through, so
// dead-lettering every message meanwhile would be wrong. Outcomes that are
// recorded (a Final or stored error, ErrResultNotStored) are not refusals:
// the Consumer acks them.
func Permanent(err error) bool {
	var p permanent
	return errors.Is(err, ErrMismatch) || errors.As(err, &p)
}

// permanent marks an error about the request itself, which no retry of it
// can fix (see Permanent).
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// callerLeft is the error of a caller whose ctx ended while its run goes
// on: ctx's error (and its cause), in words that say the outcome will be
// recorded.
func callerLeft(ctx context.Context) error {
	err := fmt.Errorf("idempotency: the caller's context ended while the handler ran; it runs on under its lock, and its outcome is recorded for a retry to replay: %w", ctx.Err())
	if c := context.Cause(ctx); c != nil && c != ctx.Err() {
		err = redlease.Wrap(err, c)
	}
	return err
}

// triedUntilCtxEnded is the error of a lock attempt refused after ctx
// ended, for a refusal that does not say the lock is held: it wraps ctx's
// error (and cause) and the lock's.
func triedUntilCtxEnded(ctx context.Context, lockErr error) error {
	err := fmt.Errorf("idempotency: the caller's context ended while the lock was tried (%w); the lock said: %w", ctx.Err(), lockErr)
	if c := context.Cause(ctx); c != nil && c != ctx.Err() && !errors.Is(lockErr, c) {
		err = redlease.Wrap(err, c)
	}
	return err
}

// ErrClosed: the Barrier was closed (Close); it runs nothing more, and the
// context of a handler still running when Close gave up waiting is
// cancelled with it as the cause.
var ErrClosed = errors.New("idempotency: Barrier closed")

// notRecorded is the error of a run whose outcome could not be stored:
// ErrNotRecorded, the handler's error if it returned one, and the store's.
func notRecorded(herr, storeErr error) error {
	if herr != nil {
		return fmt.Errorf("%w: the handler ran (its effect may have happened) and returned its outcome (%w), but that outcome could not be stored: %w", ErrNotRecorded, herr, storeErr)
	}
	return fmt.Errorf("%w: the handler ran and succeeded (its effect may have happened), but its result could not be stored: %w", ErrNotRecorded, storeErr)
}

// InProgressError is ErrInProgress with a hint of when to try again.
type InProgressError struct {
	RetryAfter time.Duration
}

// Error says the request is in progress and when to try again.
func (e *InProgressError) Error() string {
	return fmt.Sprintf("%v (retry after %v)", ErrInProgress, e.RetryAfter)
}

// Is makes errors.Is(err, ErrInProgress) true.
func (e *InProgressError) Is(target error) bool { return target == ErrInProgress }

// FinalError marks a handler's error as a definitive business outcome
// ("insufficient funds"): it is stored and replayed to duplicates like a
// success. Other errors release the request so a retry can run.
type FinalError struct{ Err error }

// Final wraps err as a FinalError.
func Final(err error) error {
	if err == nil {
		return nil
	}
	return &FinalError{Err: err}
}

// Error is the business error's text.
func (e *FinalError) Error() string { return e.Err.Error() }

// Unwrap returns the business error.
func (e *FinalError) Unwrap() error { return e.Err }

// StoredError is a failure replayed from the record: the text of the error
// the first run returned.
type StoredError struct{ Message string }

// Error is the stored error's text.
func (e *StoredError) Error() string { return e.Message }
