package idempotency

import (
	"time"

	"github.com/redlease/redlease"
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

// Option configures a Barrier.
type Option interface {
	apply(*Barrier) error
}

type optionFunc func(*Barrier) error

func (f optionFunc) apply(b *Barrier) error { return f(b) }

// WithStrategy keeps requests in flight exclusive with s (quorum, for a
// settlement); without it the Barrier locks with the single strategy on
// the store. A Barrier with its own strategy runs a request's steps one by one (five
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
