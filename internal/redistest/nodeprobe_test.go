package redistest

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A node probe sees a node the machine does not run (here paused with
// SIGSTOP, which StallProbe cannot see) in the stretch that covers the
// pause, not in one before it, and its window says so. The stretch before
// the pause is compared with itself, measured before the pause and after
// it, once every PING sent in it has been answered (a node's PINGs go one
// at a time: one sent after it was answered): what the machine did in it
// does not matter.
func TestNodeProbeSeesAStoppedNode(t *testing.T) {
	srv := Start(t, Config{})
	stall := StartStallProbe(t)
	nodes := StartNodeProbe(t, srv.Client())
	time.Sleep(50 * time.Millisecond)
	quiet := time.Now()
	stall.WaitFor(t, 5*time.Second, 3, time.Millisecond, func() bool {
		nodes.mu.Lock()
		defer nodes.mu.Unlock()
		for _, pg := range nodes.pings[0] {
			if pg.sent.After(quiet) && pg.took >= 0 {
				return true
			}
		}
		return false
	}, "a PING sent after %s answered", quiet.Format("15:04:05.000"))
	worstBefore, _ := nodes.Worst(time.Time{}, quiet)
	start := time.Now()
	srv.Pause()
	// Resume once a PING has waited 100 ms on the paused node.
	stall.WaitFor(t, 5*time.Second, 3, time.Millisecond, func() bool {
		nodes.mu.Lock()
		defer nodes.mu.Unlock()
		n := len(nodes.pings[0])
		return n > 0 && nodes.pings[0][n-1].took < 0 && time.Since(nodes.pings[0][n-1].sent) >= 100*time.Millisecond
	}, "a PING held 100 ms by the paused node")
	srv.Resume()
	time.Sleep(20 * time.Millisecond)
	took := time.Since(start)
	nodes.Stop()

	worst, pings := nodes.Worst(start, start.Add(took))
	require.Positive(t, pings, "PINGs in the stretch")
	require.GreaterOrEqual(t, worst, 100*time.Millisecond, "a PING waited out the pause")
	before, _ := nodes.Worst(time.Time{}, quiet)
	require.Equal(t, worstBefore, before, "a stretch before the pause does not count it")
	require.GreaterOrEqual(t, nodes.Allowance(stall, time.Second, 2, start, start.Add(took)), time.Second+200*time.Millisecond)
	ok, why := nodes.Within(stall, took, time.Millisecond, 3, start)
	require.True(t, ok, "3 × a pause covers the stretch of the pause: %s", why)
	require.Contains(t, why, "PINGs to the live nodes took")
	ok, why = nodes.Within(stall, took, time.Millisecond, 0, start)
	require.False(t, ok, "no allowance: %s", why)
	// Late counts the PINGs sent in its stretch, and the one that waited
	// out the pause may have been sent before it began: the whole run.
	node, late, sent := nodes.Late(time.Time{}, start.Add(took), 99*time.Millisecond)
	require.Equal(t, 0, node)
	require.Positive(t, late, "the PING that waited out the pause is late (of %d)", sent)
}

// A PING that runs out of its client's read timeout is recorded as that
// long, and the watch goes on: the node is slow, not gone.
func TestNodeProbeKeepsWatchingThroughATimeout(t *testing.T) {
	srv := Start(t, Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 20 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	stall := StartStallProbe(t)
	nodes := StartNodeProbe(t, c)
	time.Sleep(20 * time.Millisecond)
	srv.Pause()
	time.Sleep(100 * time.Millisecond)
	srv.Resume()
	resumed := time.Now()
	// PINGs are sent again after the resume: awaited within 5 s plus
	// 3 × what this process was measured stalled meanwhile.
	stall.WaitFor(t, 5*time.Second, 3, 5*time.Millisecond, func() bool {
		_, _, sent := nodes.Late(resumed.Add(time.Millisecond), time.Now(), time.Hour)
		return sent > 0
	}, "a PING sent after the resume")
	nodes.Stop()
	_, late, _ := nodes.Late(time.Time{}, resumed, 15*time.Millisecond)
	require.Positive(t, late, "PINGs that timed out during the pause count as late")
}
