// Package renew keeps many locks alive with a few goroutines.
//
// A Watchdog is shared by a whole process. Keep hands it a lock; from then
// on the lock is extended whenever a third of its TTL (WithFraction) has
// passed since its last extension. Locks that fall due together are extended
// together through redlease.ExtendAll, so a strategy that batches (single,
// quorum) pays one round trip per node per batch, not one per lock: ten
// thousand locks cost a handful of script calls per node per tick.
//
// # What a kept lock guarantees
//
// A renewal that finds the lock no longer held (expired, taken over, or
// missing on too many nodes) marks it lost at once: Lost closes and Valid
// turns false. A renewal that cannot be decided (a node down, a timeout) is
// retried soon while the lock is still valid. If no renewal succeeds in
// time, the lock's own deadline closes Lost a loss margin before its Until
// (redlease.WithLossMargin). Either way Lost closes before the lock's
// validity ends, never after, provided the process is not paused for longer
// than the margin — which is what fences are for.
//
// Release stops a lock's renewal; so does the stop function Keep returns.
// Stop stops the Watchdog and every goroutine it started.
package renew
