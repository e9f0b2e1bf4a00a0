package sim

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// The tallies of examined counts (examined.go) and of the fifo figures
// (fifo.go), kept beside sim_test.go's; tallyMu guards them too.
var (
	examinedBy = map[string]map[string]int{} // scenario → invariant → count
	fairBy     = map[string]*FairStats{}
)

// tallyMore adds a run's examined counts and fifo figures. Called with
// tallyMu held.
func tallyMore(res *Result) {
	m := examinedBy[res.Scenario]
	if m == nil {
		m = map[string]int{}
		examinedBy[res.Scenario] = m
	}
	for inv, n := range res.Examined {
		m[inv] += n
	}
	if res.Fair != (FairStats{}) {
		if fairBy[res.Scenario] == nil {
			fairBy[res.Scenario] = &FairStats{}
		}
		fairBy[res.Scenario].add(res.Fair)
	}
}

// moreReport is the report of tallyMore's tallies. Called with tallyMu
// held.
func moreReport() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(fairBy)) {
		s := fairBy[k]
		fmt.Fprintf(&b, "  %s fifo: free-key grants to fair attempts checked %d (a live line of others on the node %d), head of the node's line every time but %d; locks granted on a node whose line lacked an earlier waiter still attempting (a fairness miss fair mode admits) %d; refreshes and takeovers %d, grants to the client without fairness %d, Queued refusals %d\n",
			k, s.Grants, s.Lined, s.Ahead, s.Missed, s.Refreshes, s.Unfair, s.Queued)
	}
	b.WriteString("examined per scenario and invariant:\n")
	for _, k := range slices.Sorted(maps.Keys(examinedBy)) {
		fmt.Fprintf(&b, "  %-18s %s\n", k, examinedLine(examinedBy[k]))
	}
	return b.String()
}

// examinedTotal sums the examined counts over the scenarios.
func examinedTotal() map[string]int {
	tallyMu.Lock()
	defer tallyMu.Unlock()
	out := map[string]int{}
	for _, m := range examinedBy {
		for inv, n := range m {
			out[inv] += n
		}
	}
	return out
}

// checkTally fails the test when an invariant that applies to a scenario
// examined nothing over at least minExaminedSeeds of its seeds.
func checkTally(t *testing.T) {
	tallyMu.Lock()
	defer tallyMu.Unlock()
	for _, sc := range slices.Sorted(maps.Keys(seedsBy)) {
		for _, inv := range examinedNothing(sc, seedsBy[sc], examinedBy[sc]) {
			t.Errorf("%s: invariant %s examined nothing over %d seeds: it cannot fail there", sc, inv, seedsBy[sc])
		}
	}
}
