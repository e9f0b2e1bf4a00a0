package fanout

import (
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
)

// A node's queue holds queueLen requests behind its busy workers, refuses
// the next one at once (ErrOverloaded), and sends the queued ones once the
// workers are free. Forced order: the node's one worker is busy
// with a request held in a gate while the queue fills.
func TestQueueHoldsQueueLenThenRefuses(t *testing.T) {
	gate, probe := gatedServer(t)
	client := gate.Client()
	ns := New([]redis.UniversalClient{client}, 1, 30*time.Second)
	t.Cleanup(ns.Close)
	ctx := t.Context()
	call := func(i int) Call {
		return Call{Script: script.Extend, Line: script.Extend.Args("queue:"+strconv.Itoa(i), "tok", int64(1000))}
	}

	gate.HoldRequests(script.Extend.Hash())
	busy := ns.Start(ctx, call(0), Call{})
	require.NoError(t, gate.WaitHeld(1, "", 10*time.Second), "the worker's request is held: it is busy")
	queued := make([]*Round, queueLen)
	for i := range queued {
		queued[i] = ns.Start(ctx, call(i+1), Call{})
		require.Empty(t, queued[i].Arrived(), "request %d waits in the queue", i)
	}
	over := ns.Start(ctx, call(queueLen+1), Call{})
	require.Len(t, over.Arrived(), 1, "the request past queueLen is answered at once")
	require.ErrorIs(t, over.Result(0).Err, ErrOverloaded)

	gate.Open()
	for i, r := range append([]*Round{busy}, queued...) {
		redistest.Await(t, probe, r.Arrived(), 20*time.Second, 3, "round %d never arrived", i)
		require.NoError(t, r.Result(0).Err, "round %d", i)
	}
	require.Equal(t, 0, gate.Held())
}
