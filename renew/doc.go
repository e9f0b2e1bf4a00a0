// Package renew keeps many locks alive with a few goroutines.
//
// A Watchdog is shared by a whole process. Keep hands it a lock; from then
// on the lock is extended on a renewal interval of a third of its TTL
// (WithFraction), by that TTL: the lock's current one (Lock.TTL, that of its
// latest Lock.Extend), read again at every renewal, and at once when an
// Extend shortens it. A lock whose deadline (Until less the loss margin)
// is nearer than its interval would allow for is renewed sooner: halfway
// from its last renewal to its deadline, at the earliest half an interval
// after it. Locks that fall due together are extended together
// through redlease.ExtendAll, so a strategy that batches (single, quorum)
// pays one round trip per node per batch, not one per lock: ten thousand
// locks cost a handful of script calls per node per tick. To make batches,
// a lock is taken a quarter of its interval before it is due, and every
// lock due within a further quarter goes along: a lock is extended between
// half and three quarters of its interval after its last extension (later
// only when the call slots of its strategy are busy or the process does
// not run). Locks kept together settle into one batch every three quarters of
// the interval; while locks keep arriving at scattered moments, batches come
// more often, and each lock is extended up to twice per interval.
//
// Locker.Do does not need a Watchdog: without redlease.WithKeeper it keeps
// its lock with a process-wide default watchdog, the same engine with the
// default options, whose goroutines end whenever it keeps no lock. Make a
// Watchdog for other options (WithFraction, WithTimeout, WithMaxCalls,
// WithClock), to keep locks taken with Lock, or to end renewal yourself
// (Close); give it to Do with redlease.WithKeeper.
//
// # What a kept lock guarantees
//
// A renewal that finds the lock not held (expired, taken over, or
// missing on too many nodes) marks it lost at once: Lost closes and Valid
// turns false. A renewal that cannot be decided (a node down, a timeout) is
// retried soon while the lock is still valid. If no renewal succeeds in
// time, the lock's own deadline closes Lost a loss margin before its Until
// (redlease.WithLossMargin). Either way Lost closes before the lock's
// validity ends, provided the process runs: Lost is closed by a timer, and
// a process that is stopped, paused or starved of CPU for longer than the
// margin runs it after Until, when it resumes. Valid and Err read the clock
// themselves and never report a lock held past its deadline; for work that
// must not outlive the lock, that is what fences are for.
//
// # One sick neighbour costs only its own locks
//
// Locks are renewed per strategy, and on a Redis Cluster per master
// (redlease.Sharder: the master that served the key when it was kept):
// each such group's due locks go out in their own call, on their own
// goroutine, under their own deadline (the renewal timeout, WithTimeout,
// never past the latest of its locks' Until less the loss margin: a lock
// near its deadline does not cut the call short for the others), and at
// most WithMaxCalls calls per group are in flight, counting calls the
// Watchdog stopped waiting for. A paused node or a strategy whose client
// ignores its context therefore delays only its own strategy's locks, and
// a hung or slow Cluster master (one waiting out WAIT for a replica that
// is behind) only its own. Within a batch every key has its own outcome
// (single, failover and quorum answer per key, per node and per Cluster
// master): a key overwritten by a value of another type is lost alone, a
// master that does not answer costs only its own keys.
//
// A renewal that fails without a verdict (a timeout, an error reply such
// as READONLY, LOADING, NOPERM or BUSY) is retried after min(interval/4,
// MaxRetryDelay), never sooner, while the lock is valid.
//
// # CPU starvation
//
// A renewal costs a few goroutine wake-ups (the scheduler's timer, the
// reply from each node), and each of them waits for a processor. The
// renewal must complete within (1 − fraction)·TTL less the loss margin of
// its previous one, and each quorum round within the quorum's node timeout
// (100 ms by default). A starved process's wake-ups wait tens of
// milliseconds, and short TTLs are lost first (the figures are in
// docs/bench/PERFORMANCE.md; TestStarvedProcessKeepsHealthyLocks measures
// them, with STARVE_TTL and STARVE_NODE_TIMEOUT). Give a process that may
// be starved a TTL of seconds and a quorum node timeout well above its
// scheduling delays. A starved process loses liveness first, and it never
// reports a lock held past its deadline (Valid and Err read the clock);
// but Lost, and Do's context with it, close only when the process runs a
// timer: starved for longer than the loss margin, they close after Until
// (TestMixedStrategiesWithSickNodes measures how late this process runs
// its timers and accepts a loss noticed after Until only during a stall at
// least as long). A longer margin buys time against starvation; only a
// fence makes a late holder harmless.
//
// Release stops a lock's renewal; so does the stop function Keep returns.
// Close stops the Watchdog and every goroutine it started, waiting at most
// one renewal timeout for calls in flight; a call whose client ignores its
// context is left to end at the client's own timeout.
package renew
