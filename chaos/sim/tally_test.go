package sim

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// The tally of examined counts (examined.go), kept beside sim_test.go's;
// tallyMu guards it too.
var examinedBy = map[string]map[string]int{} // scenario → invariant → count

// tallyMore adds a run's examined counts. Called with tallyMu held.
func tallyMore(res *Result) {
	m := examinedBy[res.Scenario]
	if m == nil {
		m = map[string]int{}
		examinedBy[res.Scenario] = m
	}
	for inv, n := range res.Examined {
		m[inv] += n
	}
}

// moreReport is the report of tallyMore's tally. Called with tallyMu
// held.
func moreReport() string {
	var b strings.Builder
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
