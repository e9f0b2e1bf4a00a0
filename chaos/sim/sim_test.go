package sim

import (
	"flag"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

var (
	flagSeeds     = flag.Int("seeds", 0, "seeds to explore (0: the default budget)")
	flagSeed      = flag.Int64("seed", -1, "replay one seed and print its schedule and history")
	flagScenario  = flag.String("scenario", "", "only this scenario (default: the rotation)")
	flagFirst     = flag.Uint64("first", 1, "first seed explored")
	flagStop      = flag.Bool("stopfail", false, "stop at the first failing seed (power tests)")
	flagLostFirst = flag.Bool("lostfirst", false, "call Lock.Lost first on every grant (exposes the double-close panic)")
)

// scenarioOf is the scenario seed s runs.
func scenarioOf(s uint64) Scenario {
	if *flagScenario != "" {
		sc, ok := ScenarioByName(*flagScenario)
		if !ok {
			panic("unknown scenario " + *flagScenario)
		}
		return sc
	}
	return Scenarios[s%uint64(len(Scenarios))]
}

func replayCmd(r *Result) string {
	return fmt.Sprintf("go test ./chaos/sim -run 'TestSim$' -scenario %s -seed %d", r.Scenario, r.Seed)
}

func TestSim(t *testing.T) {
	if *flagSeed >= 0 {
		s := uint64(*flagSeed)
		var res *Result
		synctest.Test(t, func(t *testing.T) { res = Run(scenarioOf(s), s, Options{Log: true, LostFirst: *flagLostFirst}) })
		t.Logf("scenario %s seed %d: %s", res.Scenario, res.Seed, res.Verdict)
		t.Log("schedule:\n" + joinFaults(res.Schedule))
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
	var hazards atomic.Int64
	began := time.Now()
	for i := range n {
		s := *flagFirst + uint64(i)
		var res *Result
		synctest.Test(t, func(t *testing.T) { res = Run(scenarioOf(s), s, Options{LostFirst: *flagLostFirst}) })
		switch res.Verdict {
		case Fail:
			for _, v := range res.Violations {
				t.Log(v)
			}
			t.Errorf("seed %d (%s) FAILED after %d seeds in %v; replay: %s", s, res.Scenario, i+1, time.Since(began).Round(time.Millisecond), replayCmd(res))
			if *flagStop {
				return
			}
		case Hazard:
			hazards.Add(1)
		}
	}
	el := time.Since(began)
	t.Logf("%d seeds in %v (%.0f/s), %d hazards", n, el.Round(time.Millisecond), float64(n)/el.Seconds(), hazards.Load())
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
