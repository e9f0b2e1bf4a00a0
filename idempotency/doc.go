// Package idempotency makes a business request take effect once, however
// often it arrives: double clicks, client retries after a timeout, message
// redelivery. The second caller gets a useful answer, not a second effect.
//
//   - Barrier: request keys and payload fingerprints. The first caller runs
//     the handler under a lock (renewed while it runs); a duplicate after
//     completion gets the stored result, marked replayed; a duplicate while
//     it runs gets ErrInProgress (or waits, with DoWait); the same key with a
//     different payload gets ErrMismatch.
//   - Tokens: one-time tokens, issued and consumed atomically.
//   - Consumer: MQ dedup with an ack decision.
//   - Middleware: the IETF Idempotency-Key header for net/http.
//
// # One record, atomic steps
//
// Each request key has one record on the store: in progress (owner, fence,
// payload fingerprint), then completed (stored result) or released. Peek,
// claim, complete and release are each one Lua script, and complete and
// release check the owner, so no step races another and no caller deletes
// a record it did not claim. A handler that outlived its lock (it was
// paused, or partitioned) finds its record taken over and its result
// refused (ErrNotOwner).
//
// # Keys
//
// A Barrier keeps everything under its prefix (WithPrefix, default
// "idem:"), in namespaces that no key can leave: records of request keys
// (Do) at prefix+"r:"+key, of message ids (Consumer) at prefix+"m:"+id, of
// HTTP requests (Middleware) at prefix+"h:"+hash, and the in-flight locks
// at prefix+"l:"+hex, 32 hex digits of a hash of the record's namespace and
// key (the lock strategy adds each lock's fence counter, in its own
// namespace). So any bytes
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
// business outcomes: "insufficient funds"). Panics, context cancellation and
// other errors release the record so a retry can run; WithStoreEverything
// stores every outcome once the handler ran. Results are kept
// WithRetention (default 24 h) — independent of the lease, which only
// bounds a request in flight — and are bounded in size (WithMaxResult).
//
// # What the choices guarantee
//
// The in-flight lock defaults to the single strategy on the store: one
// Redis, cheap, exclusive as long as that primary keeps its data. With
// WithStrategy(quorum) the lock survives the loss of a minority of lock
// nodes; the record itself still lives on the store, so make the store
// durable (persistence, or failover with WAIT) where results must survive
// it. Whatever the choice, a handler's own writes must carry the fence it
// was given: that is what refuses a handler that woke up too late.
package idempotency
