// Package chaos runs real redis-server processes, injects faults and checks
// that no two holders overlapped, that fences kept a late holder's writes
// out, and that every strategy keeps exactly the promises its package docs
// make, no more and no less. A scenario is one fault pattern against one
// strategy; its verdict says whether the strategy held its guarantees, broke
// them only in the way its docs warn about, or broke them.
//
// # Recording
//
// A Recorder keeps one monotonic clock per scenario and collects, on it,
// every Hold (one holder's belief interval: from the grant until the
// earliest of Until, loss and release), every injected Fault, every failed
// lock attempt, and every operation on a fenced Register. Holders call
// Recorder.At to put a Lock's Until on the recorder's clock.
//
// The Register is the storage the fences protect: a value in a separate
// "storage" redis-server that the scenarios never fault, changed by one Lua
// script that accepts a write only when its fence is strictly greater than
// the last fence it accepted. Because it is a real concurrent object, its
// history is checked for linearizability rather than trusted. A holder
// should write once per hold: a second write with the same fence is refused
// and counted as a rejected write.
//
// # Oracles
//
// Recorder.Check judges a scenario with five oracles:
//
//   - O1, fences protect storage (always required): the register history is
//     linearizable against a fenced-register model (checked with porcupine,
//     bounded in time; a check that timed out is not a pass), and no
//     accepted write overwrote a value written by a holder that was granted
//     later than the writer.
//   - O2, mutual exclusion: no two holds by different holders have
//     intersecting [From, To) intervals. A holder's own re-grant is not an
//     overlap, and intervals that merely touch do not intersect.
//   - O3, no stray keys: no lock key outlives its TTL by more than a small
//     epsilon. The recorder cannot see keys: the scenario counts them into
//     Result.StrayKeys and calls Judge again.
//   - O4, no lost acknowledgements: every acknowledged ledger entry is still
//     there after the faults (counted by the scenario like O3).
//   - O5, loss is announced in time: a Lock's Lost channel, when it closes,
//     closes before the grant's Until.
//
// An Expectation says which of O2–O5 the fault lies outside the strategy's
// assumptions for, so that their violation is the documented hazard (for
// example, single's failover before replication may overlap, O2) rather
// than a bug. Judge gives the verdict: PASS when every oracle held, HAZARD
// when only allowed oracles were violated, and FAIL otherwise; a violation
// of O1, or a linearizability check that timed out, is always FAIL. Every
// violation is named in Result.Notes, allowed ones included.
//
// # Reports
//
// PrintTable prints one aligned line per scenario for the test log.
// Recorder.WriteReport draws the scenario's timeline as an SVG (holds,
// overlaps in red, losses, faults and register writes) and, when the
// register history is not linearizable, porcupine's interactive
// visualisation; WriteIndex ties them together in an index.html that a
// browser opens from the file system.
//
// # Module
//
// chaos (with chaos/sim) is a module of its own,
// github.com/redlease/redlease/chaos, so that its dependencies (toxiproxy,
// porcupine, SQLite) stay out of the library's module graph; its go.mod
// points the library at this repository with a replace directive. Run it
// from the repository's root with `make chaos` (every scenario), `make test`
// (the fast subset) or go -C chaos test . -run TestScenario.
package chaos
