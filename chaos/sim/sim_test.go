package sim

import (
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	flagSeeds      = flag.Int("seeds", 0, "seeds to explore (0: the default budget)")
	flagSeed       = flag.Int64("seed", -1, "replay one seed and print its schedule and history")
	flagScenario   = flag.String("scenario", "", "only this scenario (default: the rotation)")
	flagRotation   = flag.String("rotation", "", `the rotation without -scenario: "" the lock scenarios, "idem" the idempotency ones, "fence" the fence-expiry ones, "elect" the election ones`)
	flagFirst      = flag.Uint64("first", 1, "first seed explored")
	flagInv        = flag.String("inv", "", "comma-separated invariants that count (default: all); power tests use it to show which check finds a defect")
	flagReplays    = flag.Int("replays", 1, "with -seed: run it this many times and report how often each verdict and each history came back")
	flagProgress   = flag.Bool("progress", false, "log a progress line every 10 s")
	flagStop       = flag.Bool("stopfail", false, "stop at the first failing seed (power tests)")
	flagLostFirst  = flag.Bool("lostfirst", false, "call Lock.Lost first on every grant (exposes the double-close panic)")
	flagWorkers    = flag.Int("workers", 0, "seeds run at once (0: GOMAXPROCS)")
	flagReplayDump = flag.String("replaydump", "", "with -replays: write each distinct history to a file in this directory")
	flagList       = flag.Bool("list", false, "print the names of the rotation's scenarios (-rotation), one a line as `scenario NAME`, and run nothing (det.sh)")
)

// TestMain silences go-redis's own log (its dial retries while a node
// restarts print a line each; thousands per big run).
func TestMain(m *testing.M) {
	redis.SetLogger(quiet{})
	os.Exit(m.Run())
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// scenarioOf is the scenario seed s runs.
func scenarioOf(s uint64) Scenario {
	if *flagScenario != "" {
		sc, ok := ScenarioByName(*flagScenario)
		if !ok {
			panic("unknown scenario " + *flagScenario)
		}
		return sc
	}
	rot := rotationOf()
	return rot[s%uint64(len(rot))]
}

// rotationOf is the rotation -rotation names.
func rotationOf() []Scenario {
	rot := Rotation
	switch *flagRotation {
	case "":
	case "idem":
		rot = IdemRotation
	case "fence":
		rot = FenceRotation
	case "elect":
		rot = ElectRotation
	default:
		panic("unknown rotation " + *flagRotation)
	}
	return rot
}

func replayCmd(r *Result) string { return replayOf(r.Scenario, r.Seed) }

// replayOf is the command that replays seed of scenario.
func replayOf(scenario string, seed uint64) string {
	return fmt.Sprintf("go -C chaos test ./sim -run 'TestSim$' -scenario %s -seed %d", scenario, seed)
}

func TestSim(t *testing.T) {
	if os.Getenv("GOGC") == "" {
		// A run allocates a few MB and keeps little: GC at 4x the live
		// heap instead of 2x cut a tenth of the CPU.
		defer debug.SetGCPercent(debug.SetGCPercent(400))
	}
	if *flagList {
		for _, sc := range rotationOf() {
			fmt.Println("scenario", sc.Name)
		}
		return
	}
	if *flagSeed >= 0 && *flagReplays > 1 {
		replays(t, scenarioOf(uint64(*flagSeed)), uint64(*flagSeed), *flagReplays)
		return
	}
	if *flagSeed >= 0 {
		s := uint64(*flagSeed)
		var res *Result
		synctest.Test(t, func(t *testing.T) {
			res = Run(scenarioOf(s), s, Options{Log: true, LostFirst: *flagLostFirst})
		})
		t.Logf("scenario %s seed %d: %s", res.Scenario, res.Seed, res.Verdict)
		t.Logf("warm nodes (the library's scripts cached from the start): %v", res.Warm)
		t.Log("schedule:\n" + joinFaults(res.Schedule))
		for _, sc := range res.Scopes {
			t.Logf("scope of fault %d: %s", sc.Fault, sc)
		}
		t.Log("history:\n" + strings.Join(res.Log, "\n"))
		for _, v := range res.Violations {
			t.Log(v)
		}
		if res.Verdict == Fail {
			t.Errorf("FAIL: %s", replayCmd(res))
		}
		return
	}
	n := *flagSeeds
	if n == 0 {
		n = defaultSeeds()
	}
	var hazards, done, fails atomic.Int64
	var next atomic.Uint64
	var stopped atomic.Bool
	began := time.Now()
	lastProgress := began
	var progressMu sync.Mutex
	// Seeds run on GOMAXPROCS workers, each seed in its own bubble: a
	// bubble's goroutines keep one CPU busy (its clock jumps when all of
	// them block), and more workers than CPUs cost CPU per seed (the
	// rotation's 3,000 seeds on two cores: 5.4-5.8 ms per seed with 2
	// workers, 6.3 with 3, 6.6-7.4 with 8).
	var pool sync.WaitGroup
	workers := *flagWorkers
	if workers <= 0 {
		workers = runtime.GOMAXPROCS(0)
	}
	flying := newInFlight()
	stopWatch := make(chan struct{})
	var watcher sync.WaitGroup
	watcher.Go(func() {
		flying.watch(stopWatch,
			func() time.Duration { return hangLimit(done.Load(), time.Since(began), workers) },
			func(s uint64) string { return scenarioOf(s).Name },
			os.Stdout, func() { os.Exit(1) })
	})
	defer watcher.Wait()
	defer close(stopWatch)
	for range workers {
		pool.Go(func() {
			for !stopped.Load() {
				i := next.Add(1) - 1
				if i >= uint64(n) {
					return
				}
				s := *flagFirst + i
				var res *Result
				flying.start(s, time.Now())
				synctest.Test(t, func(t *testing.T) {
					res = Run(scenarioOf(s), s, Options{LostFirst: *flagLostFirst})
				})
				flying.end(s)
				onlyInvariants(res)
				switch res.Verdict {
				case Fail:
					fails.Add(1)
					for _, v := range res.Violations {
						t.Log(v)
					}
					t.Errorf("seed %d (%s) FAILED after %d seeds in %v; replay: %s", s, res.Scenario, done.Load()+1, time.Since(began).Round(time.Millisecond), replayCmd(res))
					if *flagStop {
						stopped.Store(true)
					}
				case Hazard:
					hazards.Add(1)
				}
				tally(res)
				d := done.Add(1)
				if *flagProgress {
					progressMu.Lock()
					if time.Since(lastProgress) >= 10*time.Second {
						lastProgress = time.Now()
						el := time.Since(began)
						t.Logf("progress: %d/%d seeds, %v, %.0f/s, %d hazards, %d failures", d, n, el.Round(time.Second), float64(d)/el.Seconds(), hazards.Load(), fails.Load())
					}
					progressMu.Unlock()
				}
			}
		})
	}
	pool.Wait()
	n = int(done.Load())
	el := time.Since(began)
	t.Logf("%d seeds in %v (%.0f/s), %d hazards; examined: %s", n, el.Round(time.Millisecond), float64(n)/el.Seconds(), hazards.Load(), examinedLine(examinedTotal()))
	t.Log(tallyReport())
	checkTally(t)
}

func joinFaults(fs []Fault) string {
	var b strings.Builder
	for _, f := range fs {
		b.WriteString(f.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// defaultSeeds is the budget of a plain go test: it must fit make test's
// 60 s on two cores beside every other package, under -race.
func defaultSeeds() int {
	if raceEnabled {
		return 30
	}
	return 200
}

// onlyInvariants drops the violations -inv does not name and grades again.
func onlyInvariants(res *Result) {
	if *flagInv == "" {
		return
	}
	keep := strings.Split(*flagInv, ",")
	var vs []Violation
	for _, v := range res.Violations {
		if slices.Contains(keep, v.Inv) {
			vs = append(vs, v)
		}
	}
	res.Violations = vs
	res.Verdict = grade(vs)
}

// replays runs seed s of scenario sc n times, reports how often each
// verdict came back and how many distinct histories the runs produced,
// and returns that number: canonical
// histories (canonicalHistory: every line, node-level ones included,
// tokens numbered, the lines of one virtual instant as a set), and beside
// them the same with the lines in the order they were logged. With
// -replaydump, each distinct canonical history is written to a file there.
func replays(t *testing.T, sc Scenario, s uint64, n int) int {
	verdicts := map[string]int{}
	histories := map[[32]byte]int{}
	ordered := map[[32]byte]bool{}
	var first [][32]byte // distinct canonical histories, in order of appearance
	for range n {
		var res *Result
		synctest.Test(t, func(t *testing.T) {
			res = Run(sc, s, Options{Log: true, LostFirst: *flagLostFirst})
		})
		onlyInvariants(res)
		verdicts[res.Verdict]++
		canon, ord := canonicalHistory(res.Log, res.LogAt)
		h := sha256.Sum256([]byte(strings.Join(canon, "\n")))
		ordered[sha256.Sum256([]byte(strings.Join(ord, "\n")))] = true
		if histories[h] == 0 {
			first = append(first, h)
			if *flagReplayDump != "" {
				name := filepath.Join(*flagReplayDump, fmt.Sprintf("%s-%d-h%d.txt", res.Scenario, s, len(first)))
				if err := os.WriteFile(name, []byte(strings.Join(canon, "\n")+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		histories[h]++
	}
	counts := make([]int, len(first))
	for i, h := range first {
		counts[i] = histories[h]
	}
	t.Logf("seed %d (%s) run %d times: verdicts %v; %d distinct histories %v (%d in logged order)", s, sc.Name, n, verdicts, len(histories), counts, len(ordered))
	return len(histories)
}

// Per scenario and per fault kind: seeds run, seeds with the fault, and
// hazard violations attributed to the fault kind.
var (
	tallyMu     sync.Mutex
	seedsBy     = map[string]int{}
	verdictsBy  = map[string]int{}
	faultSeeds  = map[string]int{}
	hazardsKind = map[string]int{}
	workBy      = map[string]time.Duration{}
	grantsBy    = map[string]int{} // grants, or effects for the Barrier
	excusedBy   = map[string]int{}
	faultsBy    = map[string]int{}
	lateBy      = map[string]int{} // faults scheduled after the workload ended
	watchBy     = map[string]*WatchStats{}
	failoverBy  = map[string]*FailoverStats{}
	wakeBy      = map[string]*WakeStats{}
)

func tally(res *Result) {
	tallyMu.Lock()
	defer tallyMu.Unlock()
	seedsBy[res.Scenario]++
	workBy[res.Scenario] += res.WorkEnd
	grantsBy[res.Scenario] += res.Grants + res.Effects
	excusedBy[res.Scenario] += res.Excused
	for _, f := range res.Schedule {
		faultsBy[res.Scenario]++
		if f.At >= res.WorkEnd {
			lateBy[res.Scenario]++
		}
	}
	verdictsBy[res.Scenario+" "+res.Verdict]++
	if res.Failover != (FailoverStats{}) {
		if failoverBy[res.Scenario] == nil {
			failoverBy[res.Scenario] = &FailoverStats{}
		}
		failoverBy[res.Scenario].add(res.Failover)
	}
	if res.Wake != (WakeStats{}) {
		if wakeBy[res.Scenario] == nil {
			wakeBy[res.Scenario] = &WakeStats{}
		}
		wakeBy[res.Scenario].add(res.Wake)
	}
	if res.Watch != (WatchStats{}) {
		if watchBy[res.Scenario] == nil {
			watchBy[res.Scenario] = &WatchStats{}
		}
		watchBy[res.Scenario].add(res.Watch)
	}
	tallyMore(res)
	seen := map[string]bool{}
	for _, f := range res.Schedule {
		k := f.Kind
		if f.Outside {
			k += "(outside)"
		} else if f.FenceOutside {
			k += "(outside-fences)"
		}
		if !seen[k] {
			seen[k] = true
			faultSeeds[k]++
		}
	}
	for _, v := range res.Violations {
		if v.Hazard {
			for _, k := range v.Faults {
				hazardsKind[v.Inv+" after "+k]++
			}
		}
	}
}

func tallyReport() string {
	tallyMu.Lock()
	defer tallyMu.Unlock()
	var b strings.Builder
	b.WriteString("per scenario (seeds, verdicts):\n")
	for _, k := range slices.Sorted(maps.Keys(seedsBy)) {
		fmt.Fprintf(&b, "  %-18s %6d  pass=%d hazard=%d fail=%d  (per seed: %.1f grants/effects, workload %v virtual; %d of %d faults after it ended%s)\n", k, seedsBy[k], verdictsBy[k+" "+Pass], verdictsBy[k+" "+Hazard], verdictsBy[k+" "+Fail],
			float64(grantsBy[k])/float64(seedsBy[k]), (workBy[k] / time.Duration(seedsBy[k])).Round(time.Millisecond), lateBy[k], faultsBy[k], excusedNote(excusedBy[k]))
	}
	for _, k := range slices.Sorted(maps.Keys(watchBy)) {
		s := watchBy[k]
		fmt.Fprintf(&b, "  %s healthy holds lost, by class: granted on too few nodes for the faults %d; a message between its client and a node it needed lost while fn ran %d, lost before the grant (an earlier call may hold a slot) %d; validity at grant too short for 3 round trips at the longest delay drawn %d (delay spiked %d); TTL too short for them %d (spiked %d); protected %d of %d healthy, lost %d\n",
			k, s.LostFew, s.LostMsg, s.LostBefore, s.LostGrant, s.LostGrantSpiked, s.LostTTL, s.LostTTLSpiked, s.Protected, s.Healthy, s.ProtectedLost)
		fmt.Fprintf(&b, "  %s watchdog: healthy holds %d, lost %d; bystanders of badkey/errnode %d, lost %d; token replaced on a quorum %d (lost while fn ran %d, WRONGTYPE named %d), on a minority only %d (lost %d); renewals answered by errnode %d, at most %d per lock per node per virtual second, closest %.2f retry delays apart; at most %d script calls per erroring node per virtual second; %d commands refused by a Cluster master as another's\n",
			k, s.Healthy, s.HealthyLost, s.Bystander, s.BystanderLost, s.BadHeld, s.BadLost, s.BadWrongType, s.BadMinority, s.BadMinorityLost, s.ErrRenews, s.MaxLockPerSec, s.MinGapRatio, s.MaxNodePerSec, s.Moved)
	}
	for _, k := range slices.Sorted(maps.Keys(wakeBy)) {
		s := wakeBy[k]
		perGrant := 0.0
		if s.Grants > 0 {
			perGrant = float64(s.Applied) / float64(s.Grants)
		}
		fmt.Fprintf(&b, "  %s wake: grants %d (Acquire calls applied per grant %.2f), failed Lock calls %d, confirmed releases %d; handoffs (a client waiting) %d: next grant within 5 ms %d, later %d, late (handoff-late) %d, slow (wake-slow) %d; while heads differed %d, excused by a leftover entry %d; with no pub/sub fault %d (within 5 ms %d, longest %v), with one the longest %v\n",
			k, s.Grants, perGrant, s.Failed, s.Released, s.Handoffs, s.Quick, s.Fallbacks, s.Late, s.Slow, s.HeadsDiffer, s.Leftover, s.NoFault, s.QuickNF, s.MaxNF.Round(time.Microsecond), s.MaxFault.Round(time.Microsecond))
	}
	for _, k := range slices.Sorted(maps.Keys(failoverBy)) {
		s := failoverBy[k]
		fmt.Fprintf(&b, "  %s watcher: failovers %d (with a failback %d, its announcements lost %d; no healthy Sentinel for the bound: %d); holds granted by a replaced primary %d, still believed when a healthy Sentinel named the last move %d, the latest ended %v after it\n",
			k, s.Failovers, s.Failbacks, s.Muted, s.Unwatched, s.OldHolds, s.Revoked, s.MaxLate.Round(time.Microsecond))
	}
	b.WriteString("seeds per fault kind:\n")
	for _, k := range slices.Sorted(maps.Keys(faultSeeds)) {
		fmt.Fprintf(&b, "  %-28s %6d\n", k, faultSeeds[k])
	}
	b.WriteString("hazard violations per invariant and fault kind:\n")
	for _, k := range slices.Sorted(maps.Keys(hazardsKind)) {
		fmt.Fprintf(&b, "  %-40s %6d\n", k, hazardsKind[k])
	}
	b.WriteString(moreReport())
	return b.String()
}

func excusedNote(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf("; %d repeated effects after an unknown outcome (ErrRunCancelled, ErrNotRecorded)", n)
}
