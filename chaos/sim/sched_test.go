package sim

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestEventQueueOrder: events leave the queue in (time, push order)
// order, whatever the interleaving of pushes and pops, with many events
// due at one instant.
func TestEventQueueOrder(t *testing.T) {
	t0 := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		var q eventQueue
		var ref []event // what is queued, kept sorted
		var seq uint64
		for range 400 {
			if len(ref) == 0 || r.IntN(3) > 0 {
				seq++
				e := event{at: t0.Add(time.Duration(r.IntN(20)) * time.Microsecond), seq: seq}
				q.push(e)
				i, _ := slices.BinarySearchFunc(ref, e, func(a, b event) int {
					if c := a.at.Compare(b.at); c != 0 {
						return c
					}
					return int(a.seq) - int(b.seq)
				})
				ref = slices.Insert(ref, i, e)
				continue
			}
			got := q.pop()
			require.Equal(t, ref[0].at, got.at)
			require.Equal(t, ref[0].seq, got.seq)
			ref = ref[1:]
			require.Len(t, q, len(ref))
		}
	}
}
