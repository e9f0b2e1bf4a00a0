package fanout

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
)

// takeGate makes ns's workers stop, once armed, before they take a woken
// job from the queue, until released; it counts the takes.
type takeGate struct {
	armed   atomic.Bool
	release chan struct{}
	once    sync.Once
	takes   atomic.Int32
}

func newTakeGate(t *testing.T, ns *Nodes) *takeGate {
	g := &takeGate{release: make(chan struct{})}
	ns.beforeTake = func() {
		g.takes.Add(1)
		if g.armed.Load() {
			<-g.release
		}
	}
	t.Cleanup(g.open) // before ns.Close (cleanups run last first): no worker stays stopped
	return g
}

func (g *takeGate) open() { g.once.Do(func() { close(g.release) }) }

// gatedServer is a redis-server behind a gate, with the Extend script
// loaded (a held chunk is then the EVALSHA), and a stall probe.
func gatedServer(t *testing.T) (*redistest.Gate, *redistest.StallProbe) {
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	gate := redistest.NewGate(t, srv.Addr)
	require.NoError(t, script.Extend.Load(t.Context(), srv.Client()))
	return gate, probe
}

// claimNode is one node behind a gate (gatedServer), with ns over it.
func claimNode(t *testing.T, workers int) (*Nodes, *redistest.Gate, *redistest.StallProbe, *takeGate) {
	gate, probe := gatedServer(t)
	ns := New([]redis.UniversalClient{gate.Client()}, workers, 30*time.Second)
	tg := newTakeGate(t, ns) // before any round: workers read beforeTake
	t.Cleanup(ns.Close)
	t.Cleanup(gate.Open) // first: a held request does not hold Close
	return ns, gate, probe, tg
}

func extendCall(key string) Call {
	return Call{Script: script.Extend, Line: script.Extend.Args(key, "tok", int64(1000))}
}

// warm runs one round to the end, so that the node has one worker, idle.
func warm(t *testing.T, ns *Nodes, probe *redistest.StallProbe) {
	r := ns.Start(t.Context(), extendCall("claim:warm"), Call{})
	redistest.Await(t, probe, r.Arrived(), 10*time.Second, 3, "the warm-up round never arrived")
	require.NoError(t, r.Result(0).Err)
	nd := ns.nodes[0]
	probe.WaitFor(t, 10*time.Second, 3, time.Millisecond, func() bool { return nd.idle.Load() == 1 },
		"the warm-up worker never became idle again (idle workers: %s)", redistest.Lazy(func() string { return fmt.Sprint(nd.idle.Load()) }))
	require.EqualValues(t, 1, nd.total.Load())
}

// Two jobs pushed to one node at one instant, with one idle worker and room
// for a second: the second is sent while the first is still held, whoever
// runs first. Forced order: the idle worker, woken by the first job, stops
// before it takes it (beforeTake) until both are pushed, and the first
// request is held at the gate; the second must reach the server (its reply
// arrives) meanwhile.
func TestSecondJobGetsSpareWorker(t *testing.T) {
	ns, gate, probe, tg := claimNode(t, 2)
	warm(t, ns, probe)
	tg.takes.Store(0)

	gate.HoldRequests("claim:first")
	tg.armed.Store(true)
	first := ns.Start(t.Context(), extendCall("claim:first"), Call{})
	second := ns.Start(t.Context(), extendCall("claim:second"), Call{})
	tg.open()
	require.NoError(t, gate.WaitHeld(1, "claim:first", 10*time.Second), "the first request reached the gate")

	redistest.Await(t, probe, second.Arrived(), 5*time.Second, 3,
		"the second job was not sent while the first was held: it waited behind it with a worker slot to spare")
	require.NoError(t, second.Result(0).Err)
	require.Empty(t, first.Arrived(),
		"the first request ended before the second was answered (the client's read timeout on the held request): the second waited behind it")
	require.Equal(t, 1, gate.HeldContaining("claim:first"))
	require.EqualValues(t, 2, ns.nodes[0].total.Load(), "a second worker was started")

	gate.Open()
	redistest.Await(t, probe, first.Arrived(), 10*time.Second, 3, "the first round never arrived")
	require.NoError(t, first.Result(0).Err)
	require.EqualValues(t, 2, tg.takes.Load(), "both jobs were taken by a worker")
}

// A worker that goes on, after its request, with an undo of it (the round
// failed while it was in flight) or with a request chained after it
// (StartAfter) is not free: a job pushed meanwhile gets the spare worker
// instead of waiting behind it. Forced order: the first request is held at
// the gate while the round is decided (or followed), then let through, and
// the worker's next request is held; the third job must be sent meanwhile.
func TestBusyAfterReplyIsNotFree(t *testing.T) {
	for _, tc := range []struct {
		name   string
		follow func(t *testing.T, ns *Nodes, r *Round)
	}{
		{"undo", func(t *testing.T, ns *Nodes, r *Round) { r.Decide(true) }},
		{"chained", func(t *testing.T, ns *Nodes, r *Round) {
			r.Keep("claim:acq", "tok")
			ns.StartAfter(t.Context(), extendCall("claim:rel"), "claim:acq", "tok")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns, gate, probe, _ := claimNode(t, 2)
			warm(t, ns, probe)

			gate.HoldRequests("claim:acq")
			r := ns.Start(t.Context(), extendCall("claim:acq"), extendCall("claim:rel"))
			require.NoError(t, gate.WaitHeld(1, "claim:acq", 10*time.Second))
			tc.follow(t, ns, r)
			gate.HoldRequests("claim:rel")
			require.NoError(t, gate.Step("claim:acq", 10*time.Second))
			require.NoError(t, gate.WaitHeld(1, "claim:rel", 10*time.Second), "the worker went on with its next request")
			redistest.Await(t, probe, r.Arrived(), 10*time.Second, 3, "the first reply never arrived")

			third := ns.Start(t.Context(), extendCall("claim:third"), Call{})
			redistest.Await(t, probe, third.Arrived(), 5*time.Second, 3,
				"the third job waited behind the busy worker with a worker slot to spare")
			require.NoError(t, third.Result(0).Err)
			require.Equal(t, 1, gate.HeldContaining("claim:rel"), "the worker's next request is still held")
			require.EqualValues(t, 2, ns.nodes[0].total.Load(), "a second worker was started")
		})
	}
}
