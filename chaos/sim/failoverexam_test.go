package sim

import (
	"maps"
	"slices"
	"testing"
)

// minFailoverSeeds is how many seeds of a failover scenario a TestSim run
// must have run before failover-kept is required to have examined holds.
const minFailoverSeeds = 50

// checkFailoverExamined fails t when, over at least minFailoverSeeds
// seeds of a failover scenario, failover-kept examined no hold the old
// primary granted, or none still believed when a healthy Sentinel named
// the new primary: a check that examined nothing checked nothing (it once
// matched no grant to a hold for as long as it read the token from the
// wrong argument).
func checkFailoverExamined(t *testing.T) {
	t.Helper()
	tallyMu.Lock()
	defer tallyMu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(seedsBy)) {
		sc, ok := ScenarioByName(name)
		if !ok || sc.Strategy != Failover || seedsBy[name] < minFailoverSeeds {
			continue
		}
		var st FailoverStats
		if s := failoverBy[name]; s != nil {
			st = *s
		}
		if st.OldHolds == 0 || st.Revoked == 0 {
			t.Errorf("%s: over %d seeds failover-kept examined %d holds granted by the old primary, %d of them against the watcher bound: it checked nothing", name, seedsBy[name], st.OldHolds, st.Revoked)
		}
	}
}
