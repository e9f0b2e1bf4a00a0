package fanout

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
)

// A worker that finishes its request after Close was called stops: it does
// not take a job still queued, though one is ready for it. Before, its
// select chose between the closed stop and the ready job at random, so a
// closed node sent queued requests or not as the runtime drew
// (chaos/sim idem-mixed 12: stale renewals after the run's end, a
// different history every replay). Forced order, per try: the one worker's
// request is held at the gate, a second job waits in the queue behind it,
// Close is called, and only then is the held request let through; the
// second request must never reach the server. Ten tries: the old select
// took the queued job in one try of two.
func TestCloseStopsWorkersBeforeQueuedJobs(t *testing.T) {
	gate, probe := gatedServer(t)
	t.Cleanup(gate.Open)
	for try := range 10 {
		first, second := fmt.Sprintf("close:first:%d", try), fmt.Sprintf("close:second:%d", try)
		ns := New([]redis.UniversalClient{gate.Client()}, 1, 2*time.Second)
		warm(t, ns, probe)

		gate.HoldRequests("close:") // the first and, if sent, the second
		r1 := ns.Start(t.Context(), extendCall(first), Call{})
		require.NoError(t, gate.WaitHeld(1, first, 10*time.Second), "the first request reached the gate")
		r2 := ns.Start(t.Context(), extendCall(second), Call{})
		require.EqualValues(t, -1, ns.nodes[0].idle.Load(), "the second job waits for the one worker")

		closed := make(chan struct{})
		go func() {
			ns.Close()
			close(closed)
		}()
		probe.WaitFor(t, 10*time.Second, 3, time.Millisecond, ns.Closed, "Close was not called")
		require.NoError(t, gate.Step(first, 10*time.Second), "the first request went on")
		redistest.Await(t, probe, r1.Arrived(), 10*time.Second, 3, "the first round never arrived")
		redistest.Await(t, probe, closed, 10*time.Second, 3, "Close did not return")
		require.Zero(t, gate.HeldContaining(second), "try %d: a worker took a queued job after Close", try)
		require.Empty(t, r2.Arrived(), "try %d: the queued request was answered after Close", try)
	}
}
