package sim

import (
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
)

// TestStateReadingsStand: the node readings the state check lets stand
// (a node no command on the key touched since it was read, no fault acted
// on: see checkLockLocked) say what a fresh reading says, in every
// scenario. Seeds 1-stateStandSeeds of each.
const stateStandSeeds = 8

func TestStateReadingsStand(t *testing.T) {
	seeds := stateStandSeeds
	if raceEnabled {
		seeds = 1 // about 25 s of CPU under -race beside make test's other jobs
	}
	total := 0
	for _, sc := range Scenarios {
		stood, wrong := 0, 0
		for s := uint64(1); s <= uint64(seeds); s++ {
			synctest.Test(t, func(t *testing.T) {
				res := Run(sc, s, Options{verifyReadings: true})
				stood += res.Examined[exStateStood]
				wrong += res.Examined[exStateStoodWrong]
				if res.Examined[exStateStoodWrong] > 0 {
					t.Logf("%s seed %d: %d readings stood that a fresh one contradicts", sc.Name, s, res.Examined[exStateStoodWrong])
				}
			})
		}
		t.Logf("%s: %d readings stood, %d contradicted", sc.Name, stood, wrong)
		require.Zero(t, wrong, sc.Name)
		total += stood
	}
	// The Barrier's single store and the failover primary are read afresh
	// at every check; elsewhere readings stand.
	require.Positive(t, total, "no reading stood: nothing compared")
}
