package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/bounded"
	"github.com/redlease/redlease/internal/nodes"
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

// Option configures a Barrier.
type Option interface {
	apply(*Barrier) error
}

type optionFunc func(*Barrier) error

func (f optionFunc) apply(b *Barrier) error { return f(b) }

// WithStrategy keeps requests in flight exclusive with s (quorum, for a
// settlement) instead of the default single strategy on the store. A
// Barrier with its own strategy runs a request's steps one by one (five
// round trips for a first request, against two for the default on a
// one-Redis store: see the package doc).
//
// Every request key gets a lock of its own, and with fencing on each lock
// name keeps a fence counter on the lock nodes, which expires
// redlease.DefaultFenceTTL after its last grant unless s was given another
// fence TTL (single.WithFenceTTL, quorum.WithFenceTTL,
// failover.WithFenceTTL; the default strategy's is retention+lease). A
// counter created anew starts from the server's clock, above every fence
// an expired one handed out, so a request's later fences stay above the
// fence of its record however long that record is kept.
//
// s must fence (redlease.Fencer, true): the claim refuses to take over a
// record in progress under a higher fence than its own, which is what keeps
// a late claim (granted, then delayed past a newer owner's claim) from
// taking the newer owner's record. A strategy built WithoutFencing, or one
// that does not say whether it fences (no Fencing method), is refused with
// redlease.ErrInvalid. Records claimed through s name its placement
// (redlease.Placer; its type, if it names none): see WithPrefix for
// Barriers of different lock schemes on one prefix. New refuses, with
// redlease.ErrInvalid, an s whose placement names a client that does not
// say which server it reaches: a failover or single strategy over a
// redis.NewFailoverClient ("primary FailoverClient", whatever its master),
// or a quorum with such a node. Build a failover strategy over such a
// client with failover.WithMaster (its placement is then "failover " and
// the master's name), or leave WithStrategy out to lock on the store.
func WithStrategy(s redlease.Strategy) Option {
	return optionFunc(func(b *Barrier) error {
		if s == nil {
			return redlease.Invalid("idempotency: nil strategy")
		}
		if f, ok := s.(redlease.Fencer); !ok || !f.Fencing() {
			return redlease.Invalid("idempotency: lock strategy %T does not fence (redlease.Fencer): a Barrier compares fences to refuse a late claim", s)
		}
		b.strategy = s
		return nil
	})
}

// WithKeeper renews the lock of a request in flight while its handler runs
// (share the process's renew.Watchdog); the request's record is kept as
// long. Without one a handler must finish within the lease, or its context
// is cancelled. The default strategy's fence counters expire
// retention+lease after a lock's grant, and renewals do not move that; a
// handler kept longer that then dies leaves a record that the next grant
// takes over all the same, since a counter created anew starts from the
// server's clock, above the record's fence.
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
// failure releases the request so a retry can run. Even with it, a run
// cut short (ErrRunCancelled), a handler's error that
// says its lock was lost (redlease.ErrLost) and a handler's own
// ErrInProgress are never stored: none of them is an outcome. Nor does it
// change what a Middleware on the Barrier records: a response whose status
// the Middleware does not record (a 409, a transient status, a 5xx without
// WithStoreServerErrors) is sent and its key released, whatever this
// option says; a Middleware's responses are recorded by its own options.
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
// if unintended). Such Barriers may lock through different schemes (the
// store's own lock and quorum, during a move from one to the other):
// every claim records its lock scheme (the strategy's placement,
// redlease.Placer: the default strategy's is single's on the store), and
// a record in progress under another scheme is never taken over, since
// the two locks do not exclude each other — the claim answers
// ErrInProgress. So a request whose owner died under one scheme waits for
// a Barrier of that scheme to take it over, or for its record to expire
// (the retention). A scheme is told apart by its placement only, so New
// refuses a strategy whose placement does not say where its locks live
// (see WithStrategy): failover strategies over redis.NewFailoverClient
// clients name their Sentinel master (failover.WithMaster), and Barriers
// on two masters must give them different names. A failover strategy named
// by its master and single on the same client name two schemes (their
// records wait for each other), as does the default lock on a
// NewFailoverClient store beside a failover strategy on that client. A
// prefix that would put keys under redlease.ReservedPrefix, the namespace
// of redlease's own keys, is refused with redlease.ErrInvalid. Keep other keys on the store (Tokens, your own)
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
	bound     bool // store ignores contexts on its sockets: calls return at their ctx (internal/bounded)
	locker    *redlease.Locker
	strategy  redlease.Strategy
	onStore   *storeLock // the default strategy on a one-Redis store: two round trips per first request
	keeper    redlease.Keeper
	retention time.Duration
	// retentionMillis is the retention in ms, boxed once: an argument of
	// every completion.
	retentionMillis any
	lease           time.Duration
	maxResult       int
	storeAll        bool
	prefix          string
	// scheme names the lock scheme, recorded by every claim (see
	// lockScheme). A claim never takes over a record claimed through
	// another.
	scheme string

	// Runs in flight, for Close: active counts them; idle, made by the
	// first Close, is closed when none is left; stopping ends (cause
	// ErrClosed) when Close gives up waiting, and cancels their handlers.
	mu       sync.Mutex
	closed   bool
	active   int
	idle     chan struct{}
	stopping context.Context
	stopAll  context.CancelCauseFunc
}

// New returns a Barrier whose records live on store.
func New(store redis.UniversalClient, opts ...Option) (*Barrier, error) {
	if nodes.IsNil(store) {
		return nil, redlease.Invalid("idempotency: nil store client")
	}
	b := &Barrier{store: store, bound: !bounded.HonorsContext(store), retention: DefaultRetention, lease: DefaultLease, maxResult: DefaultMaxResult, prefix: "idem:"}
	b.stopping, b.stopAll = context.WithCancelCause(context.Background())
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
	b.retentionMillis = b.retention.Milliseconds()
	given := b.strategy != nil
	if b.strategy == nil {
		// Fence counters of request locks expire with their records: a
		// request's fences are compared only while its record is kept.
		if c, ok := store.(*redis.Client); ok {
			// One Redis: the record and the lock can share a script.
			sl, err := newStoreLock(c, b.bound, b.retention, b.lease)
			if err != nil {
				return nil, err
			}
			b.onStore, b.strategy = sl, sl
		} else {
			s, err := newOnePrimary(store, b.retention+b.lease)
			if err != nil {
				return nil, err
			}
			b.strategy = s
		}
	}
	scheme, err := lockScheme(store, b.strategy, b.onStore != nil || !given)
	if err != nil {
		return nil, err
	}
	b.scheme = scheme
	lopts := []redlease.Option{redlease.WithTTL(b.lease), redlease.WithPrefix(b.prefix + nsLock)}
	if b.keeper != nil {
		lopts = append(lopts, redlease.WithKeeper(b.keeper))
	}
	l, err := redlease.New(b.strategy, lopts...)
	if err != nil {
		return nil, err
	}
	b.locker = l
	return b, nil
}

// storeScheme is the lock scheme of the store's own lock: the default
// strategy, single on the store, which every Barrier sharing the store's
// records reaches, however its client names the store.
const storeScheme = "store"

// lockScheme names the lock scheme of a Barrier on store with strategy s
// (onStore: the default strategy): storeScheme for the store's own lock,
// and for a strategy that places keys where single would on the store's
// client (redlease.Placer: the same placement, on a client whose address
// names its server); otherwise s's placement, or, if it names none, its
// type. A placement that names a client that does not say which server it
// reaches (a redis.NewFailoverClient's "FailoverClient", or no address) is
// refused with redlease.ErrInvalid: two such strategies on different
// servers would count as one scheme.
func lockScheme(store redis.UniversalClient, s redlease.Strategy, onStore bool) (string, error) {
	if onStore {
		return storeScheme, nil
	}
	p, ok := s.(redlease.Placer)
	if !ok {
		return fmt.Sprintf("%T", s), nil
	}
	pl := p.Placement()
	if anonymousPlacement(pl) {
		return "", redlease.Invalid("idempotency: lock strategy %T names its placement %q, which does not say where its locks live (a redis.NewFailoverClient reports the address %q whatever its master): Barriers locking on two masters would share records as one lock scheme; build a failover strategy with failover.WithMaster(the Sentinel master name), or leave WithStrategy out to lock on the store",
			s, pl, nodes.FailoverAddr)
	}
	if a := nodes.Addr(store); !nodes.Anonymous(a) && pl == "primary "+a {
		return storeScheme, nil
	}
	return pl, nil
}

// anonymousPlacement reports whether placement p ("primary addr", "quorum
// a,b,c") names a node by an address that does not say which server it is
// (nodes.Anonymous).
func anonymousPlacement(p string) bool {
	kind, addrs, _ := strings.Cut(p, " ")
	if kind != "primary" && kind != "quorum" {
		return false
	}
	for _, a := range strings.Split(addrs, ",") {
		if nodes.Anonymous(a) {
			return true
		}
	}
	return false
}

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

// run takes the lock, claims the record and runs h. With the lock on the
// store, the lock's acquisition also reads and claims the record (see
// storeLock), and a request found done or refused comes back as
// errSettled, with the record's state in the claim.
//
// With detach (Do, DoWait, the Consumer), everything after the lock's
// acquisition (see hold) runs on a context detached from ctx: ctx's end
// does not cut the handler short, nor decide its record. If ctx ends
// first, run returns at once with ctx's error while the run goes on in a
// goroutine the Barrier owns (see Close). Without detach (the Middleware,
// whose ctx is its own: its handler timeout), h runs on ctx as before.
func (b *Barrier) run(ctx context.Context, req Request, rec, lockKey string, h Handler, detach bool) (Outcome, verdict, error) {
	var cl *claim
	lctx := ctx
	if b.onStore != nil {
		cl = &claim{rec: rec, fp: req.Fingerprint}
		lctx = withClaim(ctx, cl)
	}
	lk, err := b.locker.TryLock(lctx, lockKey)
	if errors.Is(err, errSettled) && cl.st.settled() {
		return cl.st.answer()
	}
	var nodeErr *redlease.NodeError
	refused := errors.Is(err, redlease.ErrNotObtained) && !errors.As(err, &nodeErr)
	if refused && (ctx.Err() == nil || heldByAnother(err)) {
		// Taken, not failed: someone is running this request now, or has
		// just finished it. That holds whether or not ctx ended while the
		// store answered: a refusal that says another token holds the
		// lock is the store's answer, not ctx's doing. With a lock that is not on the store, the look
		// at the record (exec's peek) and the lock are two steps, and the
		// request may have completed between them (on quorum, its lock's
		// release may still be landing on some nodes). A second look
		// answers a completed request with its result, and a payload that
		// differs with ErrMismatch, instead of "in progress".
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

// enter counts a run in flight, or refuses it once the Barrier is closed.
func (b *Barrier) enter() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	b.active++
	return nil
}

// leave counts a run finished (see enter).
func (b *Barrier) leave() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.active--
	if b.active == 0 && b.idle != nil {
		close(b.idle)
	}
}

// Close stops the Barrier: it runs no request from now on (ErrClosed), and
// waits until the runs in flight have finished — their handlers returned
// and their outcomes recorded or released — or until ctx ends, which is
// their shutdown grace. Then it cancels their handlers' contexts
// (context.Cause: ErrClosed) and returns an error that wraps ctx's; those
// runs release their records (or record what their handlers return while
// their locks are valid) on their own, within a lease, and a second Close
// waits for them again. Close may be called any number of times.
func (b *Barrier) Close(ctx context.Context) error {
	b.mu.Lock()
	b.closed = true
	if b.idle == nil {
		b.idle = make(chan struct{})
		if b.active == 0 {
			close(b.idle)
		}
	}
	idle := b.idle
	b.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
	}
	b.stopAll(ErrClosed)
	select {
	case <-idle:
		return nil
	default:
	}
	return fmt.Errorf("idempotency: Barrier closed with runs in flight, their handlers' contexts cancelled: %w", context.Cause(ctx))
}

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
	// the lock is valid, and is given no longer.
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

	// The handler's ctx ends when the lock is lost, or when Close gives up
	// waiting; meanwhile the record is kept alive as long as the lock (see
	// watch).
	hctx, cancel := context.WithCancelCause(base)
	unhook := context.AfterFunc(b.stopping, func() { cancel(context.Cause(b.stopping)) })
	defer unhook()
	var stopWatching func()
	if b.onStore != nil && b.keeper == nil {
		stopWatching = b.cancelAtExpiry(cancel, lk)
	} else {
		watching := make(chan struct{})
		go func() {
			defer close(watching)
			b.watch(hctx, cancel, lk, rec)
		}()
		stopWatching = sync.OnceFunc(func() { cancel(nil); <-watching })
	}
	defer stopWatching()

	result, panicked, herr := b.call(hctx, h, lk.Fence())
	// Decided the moment h returned: a lock that ran out before the
	// watcher said so counts as lost too.
	if hctx.Err() == nil && !lk.Valid() {
		cancel(lostCause(lk))
	}
	var cause error
	if hctx.Err() != nil {
		cause = context.Cause(hctx)
	}
	lost := cause != nil && (errors.Is(cause, redlease.ErrLost) || !lk.Valid())
	stopWatching()
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

// watch runs beside a handler until hctx ends (the handler returned, or
// the caller's ctx ended): it cancels hctx with the lock's loss, and keeps
// the in-progress record alive at least as long as the lock, so a handler
// whose lock a Keeper renews past the retention keeps its record. Renewals
// come every third of the lease or of the retention, whichever is shorter;
// one that fails is tried again at the next tick (the lock's own renewal
// decides whether the handler may go on).
//
// The loss is passed on by a goroutine of its own: a renewal stuck on a
// slow or paused store (a go-redis client without ContextTimeoutEnabled
// waits for its read timeout and retries, whatever the ctx) must not hold
// back the handler's notice past the lock's validity.
func (b *Barrier) watch(hctx context.Context, cancel context.CancelCauseFunc, lk *redlease.Lock, rec string) {
	var told sync.WaitGroup
	defer told.Wait()
	told.Go(func() {
		select {
		case <-lk.Lost():
			cancel(lostCause(lk))
		case <-hctx.Done():
		}
	})
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

// cancelAtExpiry is watch for a lock on the store that no Keeper renews,
// on a timer instead of goroutines: nothing extends such a lock and its
// strategy revokes nothing (storeLock is no Revoker), so while the handler
// runs the lock can only be lost by its validity running out, when Valid
// turns false (its Until less the loss margin) — which is when the timer
// cancels the handler's ctx, after asking the lock itself. Nor does the
// record need renewing: it was claimed for the retention, which is longer
// than the lease, and the handler's ctx ends within the lease. stop ends
// the watch and cancels the ctx (nil cause).
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

// notRecorded is the error of a run whose outcome could not be stored:
// ErrNotRecorded, the handler's error if it returned one, and the store's.
func notRecorded(herr, storeErr error) error {
	if herr != nil {
		return fmt.Errorf("%w: the handler ran (its effect may have happened) and returned its outcome (%w), but that outcome could not be stored: %w", ErrNotRecorded, herr, storeErr)
	}
	return fmt.Errorf("%w: the handler ran and succeeded (its effect may have happened), but its result could not be stored: %w", ErrNotRecorded, storeErr)
}

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
// (less the loss margin, when Valid turns false), without a watch on
// Lost (whose timer would cost every request an allocation).
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
// lock to expire instead of releasing it: with the lock on the store and
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

func (b *Barrier) peek(ctx context.Context, rec, fp string) (status, error) {
	reply, err := bounded.Call(ctx, b.bound, func(ctx context.Context) ([]any, error) {
		return peekScript.Run(ctx, b.store, []string{rec}, fp).Slice()
	}, nil)
	if err != nil {
		return status{}, fmt.Errorf("idempotency: read %s: %w", rec, err)
	}
	return parseStatus(reply)
}

func (b *Barrier) claim(ctx context.Context, rec, owner string, fence uint64, fp string) (status, error) {
	// An abandoned claim that lands later leaves a record owned by a lock
	// this run gives up: the next request takes it over (its owner's lock
	// is gone), as after a crash.
	reply, err := bounded.Call(ctx, b.bound, func(ctx context.Context) ([]any, error) {
		return claimScript.Run(ctx, b.store, []string{rec}, owner, strconv.FormatUint(fence, 10), fp, b.retention.Milliseconds(), b.scheme).Slice()
	}, nil)
	if err != nil {
		return status{}, fmt.Errorf("idempotency: claim %s: %w", rec, err)
	}
	return parseStatus(reply)
}

// errRecordGone: complete found no record at all (it expired, or the
// store lost it).
var errRecordGone = errors.New("the record is gone (expired, or lost by the store)")

func (b *Barrier) complete(ctx context.Context, rec, owner, kind string, result []byte) error {
	// An abandoned completion may still land: the caller is told the
	// outcome is unknown (ErrNotRecorded), and a duplicate then replays it.
	line := completeScript.Args(rec, owner, kindArg(kind), result, b.retentionMillis)
	var (
		n   int64
		err error
	)
	if b.bound {
		n, err = bounded.Call(ctx, true, func(ctx context.Context) (int64, error) {
			return completeScript.Run(ctx, b.store, line)
		}, nil)
	} else {
		// Called directly: the closure bounded.Call takes escapes, and
		// would cost every first request an allocation.
		n, err = completeScript.Run(ctx, b.store, line)
	}
	switch {
	case err != nil:
		return fmt.Errorf("idempotency: complete %s: %w", rec, err)
	case n == -1:
		return fmt.Errorf("idempotency: complete %s: %w", rec, errRecordGone)
	case n != 1:
		return ErrNotOwner
	}
	return nil
}

// release forgets the record if owner still owns it in progress: ok false
// if not (taken over, or gone).
func (b *Barrier) release(ctx context.Context, rec, owner string) (ok bool, err error) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.lease)
	defer cancel()
	n, err := bounded.Call(rctx, b.bound, func(ctx context.Context) (int64, error) {
		return releaseScript.Run(ctx, b.store, []string{rec}, owner).Int64()
	}, nil)
	if err != nil {
		return false, fmt.Errorf("idempotency: release %s: %w", rec, err)
	}
	return n == 1, nil
}

// renewRecord keeps owner's in-progress record for at least the retention
// from now.
func (b *Barrier) renewRecord(ctx context.Context, rec, owner string) error {
	_, err := bounded.Call(ctx, b.bound, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, renewScript.Run(ctx, b.store, []string{rec}, owner, b.retention.Milliseconds()).Err()
	}, nil)
	return err
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
