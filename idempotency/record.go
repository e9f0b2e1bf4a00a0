package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redlease/redlease"
)

// Bounds of record's retries.
const (
	recordAttempts   = 50
	recordFirstDelay = 5 * time.Millisecond
	recordMaxDelay   = 200 * time.Millisecond
)

// record stores a run's outcome, trying again with backoff while the
// store fails, for as long as the request's lock is valid. While a caller
// waits for the answer, it tries for at most a lease (and recordAttempts
// times), so that the caller hears ErrNotRecorded within a lease of the
// handler's return. Once the caller has left (left reports true: its ctx
// ended while the handler ran, and nobody can be told that the outcome
// went unrecorded), it tries for as long as the lock is valid, for at
// most the retention (the in-progress record's own TTL), until Close
// gives up waiting: the caller was told that its outcome is recorded for
// a retry to replay, and a retry must not run the handler again while the
// lock that guards its outcome still holds. It goes on after ctx ends.
// Each attempt may be a repeat of one that landed unseen, which
// completeScript answers as stored. It returns nil once stored,
// ErrNotOwner if the record was taken over, or the store's last error.
//
// With the lock on the store and no Keeper (leavesLock), nothing renews
// or revokes the lock, so the attempts go on until its validity runs out
// (less the loss margin, when Valid turns false), without listening
// on Lost (whose timer would cost every request an allocation).
func (b *Barrier) record(ctx context.Context, rec string, lk *redlease.Lock, kind string, payload []byte, left func() bool) error {
	ctx = context.WithoutCancel(ctx)
	start := time.Now()
	giveUp := start.Add(b.lease)
	if b.leavesLock() {
		giveUp = minTime(giveUp, lk.Deadline())
	}
	// unheard: the caller has left, and the lock is one that a Keeper may
	// keep (not leavesLock's), while Close has not given up waiting.
	unheard := func() bool {
		return left != nil && !b.leavesLock() && b.stopping.Err() == nil && left()
	}
	limit := func() time.Time {
		if unheard() {
			return start.Add(b.retention)
		}
		return giveUp
	}
	delay := recordFirstDelay
	for attempt := 1; ; attempt++ {
		end := minTime(limit(), lk.Until())
		actx, cancel := context.WithDeadline(ctx, end)
		err := b.complete(actx, rec, lk.Token(), kind, payload)
		cancel()
		if err == nil || errors.Is(err, ErrNotOwner) || errors.Is(err, errRecordGone) {
			return err
		}
		capped := attempt >= recordAttempts && !unheard()
		if capped || time.Now().Add(delay).After(limit()) || (!b.leavesLock() && !lk.Valid()) {
			return fmt.Errorf("%w (gave up after %d attempts)", err, attempt)
		}
		var lost, closing <-chan struct{}
		if !b.leavesLock() {
			lost = lk.Lost()
			if unheard() {
				closing = b.stopping.Done()
			}
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-lost:
			t.Stop()
			return fmt.Errorf("%w (gave up after %d attempts, at the loss of the lock)", err, attempt)
		case <-closing:
			// Close gave up waiting: the next look at limit says a lease.
			t.Stop()
		}
		delay = min(2*delay, recordMaxDelay)
	}
}

// leavesLock reports whether a run whose outcome is recorded leaves its
// lock to expire, unreleased: with the lock on the store and
// no Keeper. There every claim reads the record before it looks at the
// lock, in the same script (claimLockScript), so a completed record
// answers every duplicate by itself, and nobody ever needs its lock again;
// the release would cost two more calls in the store for nothing. The lock
// holds the run's token until its TTL (the lease at most), which is
// shorter than the record's retention: it is gone long before the record,
// and a request of the same key, after the retention, finds it free. What
// it changes: a record deleted by hand after its completion leaves the key
// "in progress" for up to a lease. A run that failed (its record released
// for a retry) still releases its lock at once, as does every other
// strategy and a Barrier with a Keeper, whose completions are confirmed
// while renewals keep the lock.
func (b *Barrier) leavesLock() bool { return b.onStore != nil && b.keeper == nil }

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// status is a record's classification.
type status struct {
	state  string // none, done, progress, mismatch, claimed
	kind   string
	result []byte
}

// settled reports whether the record's state answers the request by
// itself, without the lock: done (its result is replayed) or holding
// another payload's fingerprint (ErrMismatch). See answer.
func (st status) settled() bool { return st.state == "done" || st.state == "mismatch" }

// answer is the answer of a settled status (see settled).
func (st status) answer() (Outcome, verdict, error) {
	if st.state == "mismatch" {
		return Outcome{}, failed, ErrMismatch
	}
	out, err := st.replay()
	return out, recorded, err
}

func (st status) replay() (Outcome, error) {
	switch st.kind {
	case "err":
		return Outcome{Replayed: true}, &StoredError{Message: string(st.result)}
	case "big":
		return Outcome{Replayed: true}, ErrResultNotStored
	}
	return Outcome{Result: st.result, Replayed: true}, nil
}

func parseStatus(reply []any) (status, error) {
	if len(reply) == 0 {
		return status{}, errors.New("idempotency: empty reply")
	}
	st := status{state: fmt.Sprint(reply[0])}
	switch st.state {
	case "done":
		if len(reply) != 3 {
			return status{}, fmt.Errorf("idempotency: reply %v", reply)
		}
		st.kind = fmt.Sprint(reply[1])
		st.result = []byte(fmt.Sprint(reply[2]))
	}
	return st, nil
}

// kindArg returns a result kind boxed without allocating for the kinds
// the Barrier stores.
func kindArg(kind string) any {
	switch kind {
	case "ok":
		return kindOK
	case "err":
		return kindErr
	case "big":
		return kindBig
	}
	return kind
}

var kindOK, kindErr, kindBig any = "ok", "err", "big"
