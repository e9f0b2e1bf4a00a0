package redistest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A node probe sees a node the machine does not run (here paused with
// SIGSTOP, which StallProbe cannot see) in the stretch that covers the
// pause, not in one before it, and its window says so.
func TestNodeProbeSeesAStoppedNode(t *testing.T) {
	srv := Start(t, Config{})
	stall := StartStallProbe(t)
	nodes := StartNodeProbe(t, srv.Client())
	time.Sleep(50 * time.Millisecond)
	quiet := time.Now()
	time.Sleep(20 * time.Millisecond)
	start := time.Now()
	srv.Pause()
	time.Sleep(100 * time.Millisecond)
	srv.Resume()
	time.Sleep(20 * time.Millisecond)
	took := time.Since(start)
	nodes.Stop()

	worst, pings := nodes.Worst(start, start.Add(took))
	require.Positive(t, pings, "PINGs in the stretch")
	require.GreaterOrEqual(t, worst, 80*time.Millisecond, "a PING waited out the pause")
	before, _ := nodes.Worst(time.Time{}, quiet)
	require.Less(t, before, 80*time.Millisecond, "a stretch before the pause does not count it")
	require.GreaterOrEqual(t, nodes.Allowance(stall, time.Second, 2, start, start.Add(took)), time.Second+160*time.Millisecond)
	ok, why := nodes.Within(stall, took, time.Millisecond, 3, start)
	require.True(t, ok, "3 × a pause covers the stretch of the pause: %s", why)
	require.Contains(t, why, "PINGs to the live nodes took")
	ok, why = nodes.Within(stall, took, time.Millisecond, 0, start)
	require.False(t, ok, "no allowance: %s", why)
}
