// Package bench holds the side-by-side benchmarks of redlease against its
// peers — redsync (Redlock), bsm/redislock (one node) and the raw Redis
// commands a careful programmer would write by hand — measured in one run, on
// the same real redis-server processes, through the same go-redis clients
// (ContextTimeoutEnabled on, go-redis defaults otherwise).
//
// The package has no API: everything is in its _test.go files, and
// `make bench` runs them and draws the charts in docs/bench/ (see
// docs/bench/PERFORMANCE.md for the results and how to read them). Its one
// test, TestRedsyncInterop (run by `make test`), checks that a redsync mutex
// and a redlease lock on the same name and nodes exclude each other.
//
// bench is a module of its own (github.com/redlease/redlease/bench), so
// that the peers it measures stay out of the library's module graph.
//
// # Names
//
// Every benchmark is named Benchmark<Group>/lib=<library>/<case>, so that
// `benchstat -col /lib` puts the libraries side by side:
//
//	BenchmarkQuorum/lib=redlease/nodes=5                  acquire+release, 5 nodes, direct connections
//	BenchmarkQuorum/lib=redsync/nodes=5/parallel=16       the same from 16 goroutines (b.RunParallel)
//	BenchmarkQuorum/lib=redsync-failfast/nodes=5/slow=1   5 nodes behind proxies, one 20 ms slower
//	BenchmarkQuorum/lib=redsync/nodes=5/down=1            5 nodes behind proxies, one refusing connections
//	BenchmarkSingle/lib=raw                               SET NX PX, then an EVALSHA compare-and-delete
//	BenchmarkContention/lib=redlease/nodes=5/goroutines=32/keys=4
//	BenchmarkContentionOneKey/lib=redlease/nodes=5/goroutines=8/keys=1   the same on one key: the handoff without the CPU of four keys
//	BenchmarkContentionSingle/lib=redlease/nodes=1/goroutines=32/keys=4  the same on one node (single strategy; redsync on one pool)
//	BenchmarkWatchdog/lib=redlease/nodes=5/locks=100000   one renewal tick of every held lock
//	BenchmarkIdempotency/lib=redlease/case=replay         the barrier; lib=raw is a SET NX GET floor
//	BenchmarkIdempotencyPaired/cpus=1/case=first          the same two, interleaved op by op (ratio metrics)
//	BenchmarkHandoff/lib=redlease/nodes=5                 Release returns → the waiting Lock returns (p50/p99-handoff-ns)
//	BenchmarkElection/lib=redlease/op=term                Campaign, Proclaim, Resign on one node; peers: lock, INCR, SET, SET, unlock
//	BenchmarkElection/lib=redlease/op=leader              Election.Leader; lib=raw is a GET of the peers' record
//	BenchmarkElectionPaired/cpus=1/case=redlease/redsync  the same ops, interleaved op by op (ratio metrics)
//
// Libraries whose name starts with "redlease" are ours; the others are the
// peers the ratios are taken against.
//
// # Nodes
//
// By default each top-level benchmark starts its own redis-server processes
// on free loopback ports (redis-server must be on PATH) and stops them
// afterwards. With REDLEASE_BENCH_NODES set to a comma-separated list of at
// least five host:port addresses of independent primaries, those are used
// instead (the first one for the one-node benchmarks); keys are prefixed
// with a random run id, and nothing is flushed.
//
// `make bench` runs the one-node groups (Single, Idempotency, Election)
// pinned to one CPU with taskset, client and server together: on a small VM
// a wakeup across CPUs costs more per round trip (about 45 µs on the 2-core
// machine of the committed run) than the libraries differ, and the
// scheduler's placement of the two processes changes from run to run (±40 %
// between runs unpinned, a few per cent pinned). The multi-node groups run
// unpinned on every core.
// IdempotencyPaired, SinglePaired and ElectionPaired run in both passes,
// and say which in their names (cpus=1 pinned, cpus=2 not): each times
// ours and the peer op by op on the same moments, so its ratios hold
// still even unpinned.
//
// Proxied cases (slow=, down=) put every node behind a proxy (the
// hand-written gate of internal/redistest) that runs in a child process (the
// test binary re-executed), so that the proxies' own allocations do not count
// in the benchmark's allocs/op; their CPU time is still spent on the same
// machine, for both libraries alike. A cut node's proxy refuses connections
// and keeps its port until healed.
package bench
