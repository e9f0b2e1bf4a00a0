// Package observe reports what redlease locks do as OpenTelemetry metrics
// and trace spans, and as structured logs through log/slog.
//
// It uses the OpenTelemetry API only: by default the global providers,
// which do nothing until the program installs an SDK. Logs go nowhere
// unless WithLogger is given. Give the Observer that New returns to
// redlease.WithObserver.
//
// # Instrumentation scope
//
// Meter and tracer are both named ScopeName
// ("github.com/redlease/redlease/observe") with version Version and the
// schema URL of the semantic conventions whose attribute names are used
// here (semconv v1.43.0). Version versions the telemetry described below:
// it changes when an instrument, unit, attribute or bucket boundary does.
//
// # Metrics
//
//	name                       instrument       unit        attributes
//	redlease.acquire.duration  float histogram  s           redlease.strategy, redlease.outcome, error.type
//	redlease.wait.duration     float histogram  s           redlease.strategy, redlease.outcome, error.type
//	redlease.hold.duration     float histogram  s           redlease.strategy, redlease.ended, error.type
//	redlease.renewal.duration  float histogram  s           redlease.strategy, redlease.outcome, error.type
//	redlease.renewals          int counter      {renewal}   redlease.strategy, redlease.outcome, error.type
//	redlease.lock.lost         int counter      {lock}      redlease.strategy, error.type
//	redlease.lock.held         int up-down      {lock}      redlease.strategy
//	redlease.lock.waiting      int up-down      {waiter}    redlease.strategy
//	redlease.node.errors       int counter      {error}     redlease.strategy, redlease.operation, redlease.node.index,
//	                                                        server.address, server.port, error.type
//
// What each one measures:
//
//   - redlease.acquire.duration: one acquisition attempt (TryLock, or one
//     attempt of Lock; or one attempt at a whole set's keys in one step,
//     operation "acquire_set": see redlease.SetAcquirer), from the call
//     to the strategy's answer.
//   - redlease.wait.duration: Lock, from the call until the lock was
//     obtained or Lock gave up (every attempt and the backoff between).
//   - redlease.hold.duration: from the grant to the release, or to the loss.
//   - redlease.renewal.duration: one extension's round trip, from sending
//     it to the strategy until its answer (Lock.Extend; a keeper's renewal
//     from when its batch was sent, see redlease.Op.Began).
//   - redlease.renewals: extensions (Lock.Extend, the renew watchdog), by
//     outcome.
//   - redlease.lock.lost: locks lost while their holder still held them.
//   - redlease.lock.held: locks held now: +1 at each grant, -1 when the
//     hold ends (released or lost). Zero when nothing is held.
//   - redlease.lock.waiting: Lock calls waiting now (from the call until
//     they obtain the lock or give up). Zero when nobody waits.
//   - redlease.node.errors: failures of single nodes inside an operation,
//     counted even when the operation as a whole succeeded (a quorum grant
//     with one node down is still a node down).
//
// Histogram bucket boundaries are given to the SDK as advice
// (metric.WithExplicitBucketBoundaries), in seconds; a View installed by
// the program overrides them. The SDK's default boundaries (0, 5, 10, 25,
// …, 10000) suit milliseconds and would put every lock operation in one
// bucket.
//
//	acquire, wait, renewal: 0.0005 0.001 0.0025 0.005 0.01 0.025 0.05 0.1 0.25 0.5 1 2.5 5 10 30 60
//	hold:                   0.001 0.005 0.01 0.05 0.1 0.25 0.5 1 2.5 5 10 30 60 300 900 3600
//
// An acquisition on a LAN takes a few hundred microseconds to a few
// milliseconds; node timeouts, retries and Lock's waiting reach seconds to
// tens of seconds. Holds run from a short critical section to a job kept
// alive for an hour.
//
// # Attributes
//
// Metric attributes are all low-cardinality; lock keys are never metric
// attributes (they are unbounded), only span attributes.
//
//   - redlease.strategy: the strategy's name: "single", "quorum",
//     "failover", "idempotency" (an idempotency Barrier's default lock on
//     its store), or its Go type.
//   - redlease.operation: "acquire", "acquire_set", "wait", "extend" or
//     "release", and
//     an operator's "inspect" and "force_release" (Locker.Inspect and
//     Locker.ForceRelease: spans, logs and node failures; no histogram).
//   - redlease.outcome: see Outcome: ok, not_obtained, not_held,
//     unavailable, canceled, invalid, error.
//   - redlease.ended: how a hold ended: released or lost.
//   - redlease.node.index: the node's index in the strategy's node list.
//   - server.address, server.port: the node's address, split from its
//     host:port (server.port is omitted when the address has none, both are
//     omitted when the client does not expose an address).
//   - error.type: set only on failures (see below), to ErrorType's class of
//     the error: never the error's text.
//
// An operation failed when its error is not nil and its outcome is not
// not_obtained: a lock held by someone else is an answer, not a failure.
// Failed operations get error.type on their metrics and their span, and an
// error status on their span. Lost holds get error.type from their cause.
//
// error.type is one of, checked in this order; a sentinel's class is the
// name it is declared under:
//
//	redlease.ErrInvalid        an argument or option was rejected
//	context.Canceled           the caller's context was cancelled
//	failover.ErrFailover       the primary failed over
//	failover.ErrNotReplicated  too few replicas acknowledged a write
//	redlease.ErrUnavailable    too few nodes answered to decide
//	redlease.ErrNotObtained    the lock was not obtained
//	redlease.ErrNotHeld        the lock was not held (expired, taken over)
//	timeout                    a deadline passed (context.DeadlineExceeded, a network timeout)
//	redis.ErrClosed            the client was closed
//	redis.ErrPoolExhausted     no connection could be had from the pool
//	connection_refused         ECONNREFUSED: nothing listens at the node's address
//	connection_reset           ECONNRESET or EPIPE: the connection broke
//	io.EOF                     the node closed the connection (io.EOF, io.ErrUnexpectedEOF)
//	LOADING, READONLY, MASTERDOWN, NOREPLICAS, CLUSTERDOWN, TRYAGAIN, MOVED, ASK,
//	NOPERM, AUTH (NOAUTH, WRONGPASS), OOM, MAXCLIENTS, EXECABORT, NOSCRIPT, CROSSSLOT
//	                           Redis error replies, by the go-redis predicates
//	redis.Error                any other Redis error reply
//	redlease.ErrLost           a lost lock with no cause above (its validity ran out)
//	_OTHER                     anything else
//
// # Traces
//
// One span per operation, named "redlease." + the operation
// ("redlease.acquire", "redlease.acquire_set", "redlease.wait",
// "redlease.extend", "redlease.release"), with the attributes redlease.strategy,
// redlease.operation, redlease.key (spans only) and redlease.outcome, and
// error.type and an error status when the operation failed. Every node
// that failed inside it adds a "redlease.node.failed" event with
// redlease.node.index, server.address, server.port, error.type and
// exception.message (the error's text, on spans only).
//
// # Logs
//
// With WithLogger, failures and lost locks are logged at Warn, every other
// operation and node failure at Debug.
package observe
