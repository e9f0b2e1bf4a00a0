//go:build race

package sim

// raceEnabled: the race detector slows a run about tenfold.
const raceEnabled = true
