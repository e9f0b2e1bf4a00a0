package sim

import (
	"regexp"
	"strconv"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/require"
)

// TestWarmDraw: three nodes in four of generated runs start warm, drawn
// from the seed alone (the same seed, the same nodes), and no node of a
// hand-written world does.
func TestWarmDraw(t *testing.T) {
	warm, all := 0, 0
	for seed := uint64(1); seed <= 1000; seed++ {
		w := &World{seed: seed, warmDraw: true}
		again := &World{seed: seed, warmDraw: true}
		hand := &World{seed: seed}
		for id := range 5 {
			all++
			if w.warm(id) {
				warm++
			}
			require.Equal(t, w.warm(id), again.warm(id), "seed %d node %d", seed, id)
			require.False(t, hand.warm(id), "a hand-written world's node %d (seed %d) drawn warm", id, seed)
		}
	}
	share := float64(warm) / float64(all)
	require.InDelta(t, warmShare, share, 0.05, "%d of %d nodes warm", warm, all)
}

// noscriptLine matches a NOSCRIPT reply in a run's log, naming the node.
var noscriptLine = regexp.MustCompile(`c\d+>node(\d+)#\d+ applied evalsha .*-> -NOSCRIPT`)

// TestWarmNodesAnswerTheLibraryScriptsAtOnce: in quorum5-restart (empty,
// snapshot and durable restarts), a node drawn warm never answers
// NOSCRIPT before its first restart, a cold one does, and a warm node
// after a restart does too (Redis keeps no script cache across one).
func TestWarmNodesAnswerTheLibraryScriptsAtOnce(t *testing.T) {
	sc, ok := ScenarioByName("quorum5-restart")
	require.True(t, ok)
	var coldNoscript, warmAfterRestart, warmNodes int
	for seed := uint64(1); seed <= 40; seed++ {
		var res *Result
		synctest.Test(t, func(t *testing.T) {
			res = Run(sc, seed, Options{Log: true})
		})
		warm := map[int]bool{}
		for _, id := range res.Warm {
			warm[id] = true
		}
		warmNodes += len(res.Warm)
		for i, line := range res.Log {
			m := noscriptLine.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			id, _ := strconv.Atoi(m[1])
			if !warm[id] {
				coldNoscript++
				continue
			}
			restarted := false
			for _, f := range res.Schedule {
				if f.Kind == FaultRestart && f.Node == id && f.At < res.LogAt[i] {
					restarted = true
				}
			}
			require.True(t, restarted, "seed %d: warm node %d answered NOSCRIPT before any restart: %s", seed, id, line)
			warmAfterRestart++
		}
	}
	require.Positive(t, warmNodes, "no node was drawn warm")
	require.Positive(t, coldNoscript, "no cold node answered NOSCRIPT: the check examined nothing")
	require.Positive(t, warmAfterRestart, "no warm node answered NOSCRIPT after a restart: the check examined nothing")
	t.Logf("40 seeds: %d warm nodes; NOSCRIPT from cold nodes %d, from warm nodes after a restart %d", warmNodes, coldNoscript, warmAfterRestart)
}
