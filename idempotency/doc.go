// Package idempotency makes a business request take effect once, however
// often it arrives: double clicks, client retries after a timeout, message
// redelivery. The second caller gets a useful answer, not a second effect.
//
//   - Barrier: request keys and payload fingerprints. The first caller runs
//     the handler under a lock (renewed while it runs); a duplicate after
//     completion gets the stored result, marked replayed; a duplicate while
//     it runs gets ErrInProgress (or waits, with DoWait); the same key with a
//     different payload gets ErrMismatch.
//   - Tokens: one-time tokens, issued and consumed atomically; a consume
//     whose reply was lost and that the client sent again is recognised as
//     its own (a nonce per call), not refused as used.
//   - Consumer: MQ dedup with an ack decision.
//   - Middleware: the IETF Idempotency-Key header for net/http. It records
//     a handler's response (never a 409, a transient status or, by
//     default, a 5xx: those release the key) and replays it, but not to a
//     duplicate whose request differs in a field the response's Vary
//     names.
//
// # One record, atomic steps
//
// Each request key has one record on the store: in progress (owner, fence,
// payload fingerprint, lock scheme), then completed (stored result) or
// released. A claim takes over a record in progress only if it was claimed
// through the same lock scheme (the lock strategy's placement,
// redlease.Placer), whose lock the claimer now holds; a record of another
// scheme answers ErrInProgress (see WithPrefix). A lock strategy whose
// placement does not say where its locks live (one over a
// redis.NewFailoverClient, whose address is "FailoverClient" whatever its
// master, unless failover.WithMaster names the master) is refused with
// redlease.ErrInvalid (see WithStrategy). Peek,
// claim, renew, complete and release are each one Lua script, and renew,
// complete and release check the owner, so no step races another and no
// caller deletes a record it did not claim. A handler that outlived its
// lock (it was paused, or partitioned) has its context cancelled and its
// result discarded (ErrRunCancelled); should its lock still look valid to
// it (a double grant), its record was taken over and complete refuses its
// result (ErrNotOwner). An in-progress record lives at least as long as
// its lock: while the handler runs, its record's TTL is renewed beside the
// lock, so a handler that a Keeper keeps past the retention keeps it too.
//
// When the lock lives on the store — the default strategy on a store that
// is one Redis (a *redis.Client: standalone, or behind Sentinel), not a
// Cluster or a Ring — a first request costs two round trips: peek, the
// lock's acquisition and the claim are one script, and the completion
// another. The claim script does, step for step, what the separate steps'
// scripts and the single strategy's own Acquire do (a test runs both from
// every state that matters), so nothing about the lock differs: the same
// key, fence counter and fences (rising across owners, and across
// Barriers that run the steps separately on the same store), validity
// measured from before the request was sent. It leaves out fair mode's
// line, which no Barrier's lock uses. Without a Keeper, a run whose
// outcome is recorded does not release its lock: the lock expires within
// its TTL (the lease at most), long before the record (the retention is
// longer than the lease), and stands in nobody's way meanwhile, because
// every claim reads the record first, in the same script, and a completed
// record answers by itself. That saves the store two calls per request.
// The one thing it changes: a record deleted by hand after its completion
// leaves the request "in progress" until the lock expires. A run that
// failed still releases its lock at once, and with a Keeper the outcome is
// recorded and then the lock released (complete is retried while
// renewals keep the lock, which a release, once sent, ends). The undo of
// a failed attempt publishes the undo notice on the lock's wake channel,
// as single's does. A replay, a mismatch and a duplicate in progress cost
// one round trip. An acquisition whose reply is lost, that is abandoned at its ctx,
// or whose grant comes back with too little validity left, undoes the
// lock and the claim by its own token. Any other strategy (WithStrategy),
// and a Cluster store, runs the steps one by one: five round trips for a
// first request. There a duplicate looks at the record and then tries the
// lock; if the lock is refused, it looks at the record once more, so a
// request that completed in between (on quorum, its lock's release may
// still be landing on some nodes) answers with its result, not
// ErrInProgress.
//
// # Keys
//
// A Barrier keeps everything under its prefix (WithPrefix, default
// "idem:"), in namespaces that no key can leave: records of request keys
// (Do) at prefix+"r:"+key, of message ids (Consumer) at prefix+"m:"+id, of
// HTTP requests (Middleware) at prefix+"h:"+hash, and the in-flight locks
// at prefix+"l:"+hex, 32 hex digits of a hash of the record's namespace and
// key (the lock strategy adds each lock's fence counter, in its own
// namespace; the default strategy lets it expire retention+lease after
// its last grant, so a Barrier leaves no key without a TTL). So any bytes
// may be a request key: none names another request's record or lock, and a
// Consumer, a Middleware and direct calls can share one Barrier without
// sharing requests. A prefix that would put keys under
// redlease.ReservedPrefix is refused.
//
// Tokens live at prefix+scope+":"+token (NewTokens, default "tok:"). A
// token is exactly what Issue wrote (22 base64url characters, '.', the
// expiry in base36); anything else is refused as unknown before it reaches
// the store. A token holds no ':', so the key names one scope and one
// token: a token issued for "form:checkout" is not one of "form".
//
// Give Tokens and Barriers on the same store prefixes where neither starts
// with the other.
//
// # Result policy
//
// Successes are stored and replayed; so are errors marked Final (definitive
// business outcomes: "insufficient funds"). Panics and other errors release
// the record so a retry can run; WithStoreEverything stores every outcome
// once the handler ran, except those that are not outcomes (below) and a
// Middleware's responses, which its own options decide. Results are kept
// WithRetention (default 24 h) — independent of the lease, which only
// bounds a request in flight — and are bounded in size (WithMaxResult).
//
// A caller's context bounds its wait, never the run: once the lock is
// held, the handler runs on a context detached from the caller's (Do,
// DoWait, the Consumer), and what it returns while its lock is valid is
// recorded. A caller whose context ends first gets its context's error at
// once, while the handler runs on in the background, owned by the
// Barrier: Close waits for such runs and, at the end of its grace (its
// ctx), cancels their contexts (cause ErrClosed). A store that fails
// while an outcome is recorded is tried again: for at most a lease while
// the caller waits (it then gets ErrNotRecorded), and, once the caller
// has left, for as long as the lock stays valid (a Keeper renews it; at
// most the retention, until Close gives up waiting), since nobody could
// be told, and a retry must replay the outcome rather than run the
// handler again. What a handler returns
// after its lock was lost is discarded; so is an error other than a Final
// one that it returns after Close cancelled it: those outcomes are
// unknown, nothing is stored, not even WithStoreEverything, the record is
// released, and the caller gets ErrRunCancelled. A retry then runs the
// handler again under a higher fence, so a handler's storage must key its
// effect by the request (a unique request or payment id), not only refuse
// lower fences. A handler's own ErrInProgress (a nested Barrier, a
// downstream conflict) is a transient failure: released, returned, never
// waited on by DoWait. (The Middleware runs its handler on a context of
// its own, which its handler timeout ends: see Middleware.)
//
// A result the store cannot take when the handler returns is tried again
// while the request's lock is held. If it never lands, the caller gets the
// handler's Outcome with ErrNotRecorded: the effect may have happened, so
// it is not a failure to retry (the Consumer acks it).
//
// # What the choices guarantee
//
// The in-flight lock defaults to the single strategy on the store: one
// Redis, cheap, exclusive as long as that primary keeps its data. With
// WithStrategy(quorum) the lock survives the loss of a minority of lock
// nodes; the record itself still lives on the store, so make the store
// durable (persistence, or failover with WAIT) where results must survive
// it. A strategy must fence (redlease.Fencer): the claim compares fences to
// refuse a late claim, and WithStrategy refuses a strategy built
// WithoutFencing, or one that does not say. Whatever the choice, a
// handler's own writes must carry the fence it was given: that is what
// refuses a handler that woke up too late.
package idempotency
