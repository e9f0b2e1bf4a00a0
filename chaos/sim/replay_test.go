package sim

import "testing"

// The seeds whose replays differed from run to run, each for a scheduler
// race now fixed (docs/simulator.md, Determinism, s50), replayed within
// make test: each must give one canonical history. On the code before each
// fix: idem-mixed 12 gave 10 histories in 10 replays (fanout's Close);
// failover 48, 2 in 20, 10 and 10 (the Watcher's poll); cluster-failover
// 26, 2 in 20 (dials retried at one instant); cluster-failover 37, 2 in
// 20 (the writes after them); fence-expiry-failover 2, 20 runs of 200 off
// on the first, too wide, handshake rule; wake-herd 2, 3 histories in 3
// (a second waiter of a process, registered by Listen, drew its undo
// pauses from math/rand/v2's global source).
func TestReplaysAreExact(t *testing.T) {
	for _, c := range []struct {
		scenario string
		seed     uint64
		runs     int
	}{
		{"idem-mixed", 12, 10},
		{"failover", 48, 10},
		{"cluster-failover", 26, 20},
		{"cluster-failover", 37, 20},
		{"fence-expiry-failover", 2, 20},
		{"wake-herd", 2, 10},
	} {
		sc, ok := ScenarioByName(c.scenario)
		if !ok {
			t.Fatalf("no scenario %s", c.scenario)
		}
		if n := replays(t, sc, c.seed, c.runs); n != 1 {
			t.Errorf("%s seed %d: %d distinct histories in %d replays, want 1", c.scenario, c.seed, n, c.runs)
		}
	}
}
