package sim

import "testing"

// checkStateExamined fails the run if state-valid examined no lock in a
// scenario that ran at least 20 seeds: a check that examined nothing
// checked nothing.
func checkStateExamined(t *testing.T) {
	t.Helper()
	tallyMu.Lock()
	defer tallyMu.Unlock()
	for sc, n := range seedsBy {
		if n < 20 || *flagInv != "" {
			continue
		}
		if s := stateBy[sc]; s == nil || s.Examined == 0 {
			t.Errorf("%s: state-valid examined no lock in %d seeds", sc, n)
		}
	}
}
