package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/nodes"
	"github.com/redlease/redlease/single"
)

// Defaults, in one place.
const (
	// DefaultRetention is how long a completed request's result is kept and
	// replayed.
	DefaultRetention = 24 * time.Hour
	// DefaultLease is the TTL of the lock that keeps a request in flight
	// exclusive (renewed while the handler runs, if the Barrier has a
	// Keeper).
	DefaultLease = 30 * time.Second
	// DefaultMaxResult bounds a stored result.
	DefaultMaxResult = 64 << 10
)

// Errors a caller can check with errors.Is.
var (
	// ErrInProgress: the same request is being handled right now by someone
	// else. Try again later (HTTP 409 with Retry-After; MQ: do not ack).
	ErrInProgress = errors.New("idempotency: request in progress")
	// ErrMismatch: the key was first used with a different payload.
	ErrMismatch = errors.New("idempotency: key reused with a different payload")
	// ErrNotOwner: the caller no longer owns the in-progress record (its
	// lock expired and someone took the request over); its result was not
	// stored.
	ErrNotOwner = errors.New("idempotency: record taken over by another owner")
	// ErrResultNotStored: the request completed, but its result was larger
	// than the limit and was not kept; it will not run again.
	ErrResultNotStored = errors.New("idempotency: request completed; result too large to replay")
)

// Option configures a Barrier.
type Option interface {
	apply(*Barrier) error
}

type optionFunc func(*Barrier) error

func (f optionFunc) apply(b *Barrier) error { return f(b) }

// WithStrategy keeps requests in flight exclusive with s (quorum, for a
// settlement) instead of the default single strategy on the store.
func WithStrategy(s redlease.Strategy) Option {
	return optionFunc(func(b *Barrier) error {
		if s == nil {
			return redlease.Invalid("idempotency: nil strategy")
		}
		b.strategy = s
		return nil
	})
}

// WithKeeper renews the lock of a request in flight while its handler runs
// (share the process's renew.Watchdog). Without one a handler must finish
// within the lease, or its context is cancelled.
func WithKeeper(k redlease.Keeper) Option {
	return optionFunc(func(b *Barrier) error {
		if k == nil {
			return redlease.Invalid("idempotency: nil keeper")
		}
		b.keeper = k
		return nil
	})
}

// WithRetention sets how long results are kept and replayed. Default
// DefaultRetention (24 h). Must be longer than the lease.
func WithRetention(d time.Duration) Option {
	return optionFunc(func(b *Barrier) error {
		if d < time.Second {
			return redlease.Invalid("idempotency: retention %v: must be at least 1s", d)
		}
		b.retention = d
		return nil
	})
}

// WithLease sets the TTL of a request's in-flight lock. Default
// DefaultLease (30 s).
func WithLease(d time.Duration) Option {
	return optionFunc(func(b *Barrier) error {
		if d < 10*time.Millisecond {
			return redlease.Invalid("idempotency: lease %v: must be at least 10ms", d)
		}
		b.lease = d
		return nil
	})
}

// WithMaxResult bounds a stored result in bytes. Default DefaultMaxResult
// (64 KiB). A larger result is not kept: the request counts as done, and
// duplicates get ErrResultNotStored.
func WithMaxResult(n int) Option {
	return optionFunc(func(b *Barrier) error {
		if n < 1 {
			return redlease.Invalid("idempotency: max result %d: must be positive", n)
		}
		b.maxResult = n
		return nil
	})
}

// WithStoreEverything stores every outcome once the handler ran: errors of
// any kind are replayed too, not only Final ones. Default off: a transient
// failure releases the request so a retry can run.
func WithStoreEverything() Option {
	return optionFunc(func(b *Barrier) error {
		b.storeAll = true
		return nil
	})
}

// WithPrefix puts the Barrier's keys under prefix. Default "idem:". Under
// it, records and locks have namespaces of their own:
//
//	prefix+"r:"+key  the record of a request key (Do, DoWait)
//	prefix+"m:"+id   the record of a message id (Consumer)
//	prefix+"h:"+key  the record of an HTTP request (Middleware)
//	prefix+"l:"+hex  a request's in-flight lock: 32 hex digits of a hash of
//	                 the record's namespace and key
//
// so no request key, message id or Idempotency-Key can name another
// request's record or lock. Records and locks are named from the prefix and
// the key only, so two Barriers with the same prefix on the same store
// share requests (useful for a second Barrier with another lease; a trap
// if unintended). A prefix that would put keys under
// redlease.ReservedPrefix, the namespace of redlease's own keys, is refused
// with redlease.ErrInvalid. Keep other keys on the store (Tokens, your own)
// outside prefix.
func WithPrefix(prefix string) Option {
	return optionFunc(func(b *Barrier) error {
		for _, ns := range namespaces {
			if reserved(prefix + ns) {
				return redlease.Invalid("idempotency: prefix %q: its keys would fall under %q (redlease.ReservedPrefix), which is reserved for redlease's own keys",
					prefix, redlease.ReservedPrefix)
			}
		}
		b.prefix = prefix
		return nil
	})
}

// Barrier makes a request with a given key take effect once: the first
// caller runs the handler while the request's lock is held (and renewed), a
// duplicate after completion gets the stored result marked as replayed, a
// duplicate while it runs gets ErrInProgress (or waits, with Wait), and the
// same key with a different payload gets ErrMismatch. Safe for concurrent
// use.
//
// # What it guarantees
//
// Records live on one Redis (the store). The lock that keeps a request in
// flight exclusive is a redlease lock: by default on the store itself
// (single strategy), or on any Strategy (WithStrategy: quorum for money).
// After the lock is held the record is checked again, in the same script
// that claims it, so a request that completed while we waited for the lock
// is replayed, not rerun. A handler that outlives its lock (a pause, a
// partition) cannot store its result over a newer owner's: Complete checks
// the owner. The result record is as durable as the store (persistence,
// replication); with the default single strategy the lock is too. The
// handler itself must still use the fence (Outcome.Fence) at its own
// storage, since no lock can stop a paused handler's side effects.
type Barrier struct {
	store     redis.UniversalClient
	locker    *redlease.Locker
	strategy  redlease.Strategy
	keeper    redlease.Keeper
	retention time.Duration
	lease     time.Duration
	maxResult int
	storeAll  bool
	prefix    string
}

// New returns a Barrier whose records live on store.
func New(store redis.UniversalClient, opts ...Option) (*Barrier, error) {
	if nodes.IsNil(store) {
		return nil, redlease.Invalid("idempotency: nil store client")
	}
	b := &Barrier{store: store, retention: DefaultRetention, lease: DefaultLease, maxResult: DefaultMaxResult, prefix: "idem:"}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(b); err != nil {
			return nil, err
		}
	}
	if b.retention <= b.lease {
		return nil, redlease.Invalid("idempotency: retention %v must be longer than the lease %v", b.retention, b.lease)
	}
	if b.strategy == nil {
		b.strategy = single.New(store)
	}
	lopts := []redlease.Option{redlease.WithTTL(b.lease), redlease.WithPrefix(b.prefix + nsLock)}
	if b.keeper != nil {
		lopts = append(lopts, redlease.WithKeeper(b.keeper))
	}
	b.locker = redlease.New(b.strategy, lopts...)
	return b, nil
}

// Outcome is what Do returns for a request.
type Outcome struct {
	Result   []byte // the handler's result, or the stored one
	Replayed bool   // the result is a stored one: the handler did not run now
	Fence    uint64 // the fence the handler ran under (0 on a replay)
}

// Handler does the request's work under the lock. Its ctx is cancelled if
// the lock is lost. fence is the fence of this request's lock: it orders
// the runs of this one request (a takeover gets a higher fence), so storage
// written only by this request can refuse a stale run with it. It says
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
// ErrInProgress, ErrMismatch, ErrNotOwner, ErrResultNotStored, or a lock or
// store failure.
func (b *Barrier) Do(ctx context.Context, req Request, h Handler) (Outcome, error) {
	return b.do(ctx, nsRequest, req, h, 0)
}

// DoWait is Do, but a duplicate that finds the request in progress waits
// up to wait for it to complete and replays its result (ErrInProgress if it
// does not complete in time).
func (b *Barrier) DoWait(ctx context.Context, req Request, wait time.Duration, h Handler) (Outcome, error) {
	return b.do(ctx, nsRequest, req, h, wait)
}

// do runs h once for req.Key in namespace ns (see keys.go): Do and DoWait,
// the Consumer and the Middleware each have their own.
func (b *Barrier) do(ctx context.Context, ns string, req Request, h Handler, wait time.Duration) (Outcome, error) {
	if req.Key == "" {
		return Outcome{}, redlease.Invalid("idempotency: empty key")
	}
	if h == nil {
		return Outcome{}, redlease.Invalid("idempotency: nil handler")
	}
	rec := b.recordKey(ns, req.Key)
	deadline := time.Now().Add(wait)
	for attempt := 0; ; attempt++ {
		// Cheap first look: most duplicates are replays, and need no lock.
		st, err := b.peek(ctx, rec, req.Fingerprint)
		if err != nil {
			return Outcome{}, err
		}
		switch st.state {
		case "done":
			return st.replay()
		case "mismatch":
			return Outcome{}, ErrMismatch
		default: // none, or in progress: whoever holds the lock is running it
			// An in-progress record whose owner's lock has expired (a crash,
			// a pause) is taken over by whoever gets the lock next.
			out, err := b.run(ctx, req, rec, lockKey(ns, req.Key), h)
			if !errors.Is(err, ErrInProgress) || time.Now().After(deadline) {
				return out, err
			}
		}
		// Waiting for an in-flight duplicate: poll, bounded by the deadline.
		if err := sleepCtx(ctx, min(50*time.Millisecond*time.Duration(attempt+1), time.Until(deadline), 500*time.Millisecond)); err != nil {
			return Outcome{}, err
		}
	}
}

// run takes the lock, claims the record and runs h.
func (b *Barrier) run(ctx context.Context, req Request, rec, lockKey string, h Handler) (Outcome, error) {
	lk, err := b.locker.TryLock(ctx, lockKey)
	var nodeErr *redlease.NodeError
	if errors.Is(err, redlease.ErrNotObtained) && ctx.Err() == nil && !errors.As(err, &nodeErr) {
		// Taken, not failed: someone is running this request now.
		return Outcome{}, &InProgressError{RetryAfter: time.Second}
	}
	if err != nil {
		return Outcome{}, err
	}
	stopKeeping := func() {}
	if b.keeper != nil {
		stopKeeping = b.keeper.Keep(lk)
	}
	defer func() {
		stopKeeping()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.lease)
		_ = lk.Release(rctx)
		cancel()
	}()

	// The record, again, now that we hold the lock: a request may have
	// completed while we took it.
	st, err := b.claim(ctx, rec, lk.Token(), lk.Fence(), req.Fingerprint)
	if err != nil {
		return Outcome{}, err
	}
	switch st.state {
	case "done":
		return st.replay()
	case "mismatch":
		return Outcome{}, ErrMismatch
	case "progress":
		// Only a double grant gets here (an owner with a higher fence): it
		// will finish or lose its lock within a lease.
		return Outcome{}, &InProgressError{RetryAfter: b.lease}
	}

	// The handler's ctx ends when the lock is lost.
	hctx, cancel := context.WithCancelCause(ctx)
	lostWatch := make(chan struct{})
	go func() {
		defer close(lostWatch)
		select {
		case <-lk.Lost():
			cancel(lk.Err())
		case <-hctx.Done():
		}
	}()
	defer func() { cancel(nil); <-lostWatch }()

	result, panicked, herr := b.call(hctx, h, lk.Fence())
	if panicked != nil {
		b.release(ctx, rec, lk.Token())
		panic(panicked)
	}
	if herr != nil && !b.keep(herr) {
		b.release(ctx, rec, lk.Token())
		return Outcome{Fence: lk.Fence()}, herr
	}
	kind, payload := "ok", result
	if herr != nil {
		kind, payload = "err", []byte(herr.Error())
	}
	if len(payload) > b.maxResult {
		kind, payload = "big", nil
	}
	if err := b.complete(ctx, rec, lk.Token(), kind, payload); err != nil {
		return Outcome{Result: result, Fence: lk.Fence()}, errors.Join(herr, err)
	}
	if kind == "big" && herr == nil {
		// The caller gets its result now; duplicates will not.
		return Outcome{Result: result, Fence: lk.Fence()}, nil
	}
	return Outcome{Result: result, Fence: lk.Fence()}, herr
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
// (definitive business outcomes) yes; context cancellation and everything
// else no, unless WithStoreEverything.
func (b *Barrier) keep(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redlease.ErrLost) {
		return b.storeAll && !errors.Is(err, redlease.ErrLost) // a lost lock means we may not be the owner any more
	}
	var f *FinalError
	return b.storeAll || errors.As(err, &f)
}

// status is a record's classification.
type status struct {
	state  string // none, done, progress, mismatch, claimed
	kind   string
	result []byte
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

func (b *Barrier) peek(ctx context.Context, rec, fp string) (status, error) {
	reply, err := peekScript.Run(ctx, b.store, []string{rec}, fp).Slice()
	if err != nil {
		return status{}, fmt.Errorf("idempotency: read %s: %w", rec, err)
	}
	return parseStatus(reply)
}

func (b *Barrier) claim(ctx context.Context, rec, owner string, fence uint64, fp string) (status, error) {
	reply, err := claimScript.Run(ctx, b.store, []string{rec}, owner, strconv.FormatUint(fence, 10), fp, b.retention.Milliseconds()).Slice()
	if err != nil {
		return status{}, fmt.Errorf("idempotency: claim %s: %w", rec, err)
	}
	return parseStatus(reply)
}

func (b *Barrier) complete(ctx context.Context, rec, owner, kind string, result []byte) error {
	n, err := completeScript.Run(context.WithoutCancel(ctx), b.store, []string{rec}, owner, kind, result, b.retention.Milliseconds()).Int64()
	if err != nil {
		return fmt.Errorf("idempotency: complete %s: %w", rec, err)
	}
	if n != 1 {
		return ErrNotOwner
	}
	return nil
}

func (b *Barrier) release(ctx context.Context, rec, owner string) {
	_ = releaseScript.Run(context.WithoutCancel(ctx), b.store, []string{rec}, owner).Err()
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
