package quorum_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/contract"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/quorum"
)

// A release that comes while its acquisition's request to a node is still
// in flight reaches that node once, after the acquisition's request: it
// deletes the late write itself. (It used to be sent at once, and the late
// write then undid itself with a second delete: one command per node and
// release wasted, about one in every acquire+release.) Forced order: a
// client hook holds node 4's acquire request until the release returned.
func TestReleaseFollowsAnAcquireInFlight(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	servers, clients := nodes(t, 5)
	released := make(chan struct{})
	var deletes atomic.Int32
	clients[4].AddHook(holdBack{sha: script.Acquire.Hash(), until: released})
	clients[4].AddHook(countScript{sha: script.Release.Hash(), n: &deletes})
	s, err := quorum.New(clients, quorum.WithNodeTimeout(2*time.Second))
	require.NoError(t, err)
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = s.Close()
		}
	})
	direct := servers[4].Client()
	ctx, key := t.Context(), contract.Key(t)

	_, err = s.Acquire(ctx, key, "tok", 10*time.Second)
	require.NoError(t, err, "four prompt nodes grant")
	require.NoError(t, s.Release(ctx, key, "tok"), "four prompt nodes confirm")
	assert.Zero(t, deletes.Load(), "node 4's release waits for its acquire request")
	close(released) // node 4's acquire now reaches the server, after the release
	probe.WaitFor(t, 3*time.Second, 3, 5*time.Millisecond, func() bool {
		v, err := direct.Get(context.Background(), key).Result()
		return errors.Is(err, redis.Nil) && v == ""
	}, "node 4 keeps the released key until its TTL")
	require.NoError(t, s.Close()) // every worker done: nothing more can be sent
	closed = true
	assert.Equal(t, int32(1), deletes.Load(), "node 4 got one delete, not a release and an undo")
}

// The same with node 4's acquire held past the release round's deadline:
// the release that follows it is still sent (under a fresh deadline), so
// the late write does not stay until its TTL.
func TestReleaseFollowsAnAcquireInFlightPastItsDeadline(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	servers, clients := nodes(t, 5)
	released := make(chan struct{})
	clients[4].AddHook(holdBack{sha: script.Acquire.Hash(), until: released})
	const timeout = 200 * time.Millisecond
	s := strategy(t, clients, quorum.WithNodeTimeout(timeout))
	direct := servers[4].Client()
	ctx, key := t.Context(), contract.Key(t)

	_, err := s.Acquire(ctx, key, "tok", 10*time.Second)
	require.NoError(t, err, "four prompt nodes grant")
	require.NoError(t, s.Release(ctx, key, "tok"))
	// Not a race: every round involved has a deadline one node timeout
	// after it started; this only makes sure both have passed.
	time.Sleep(3 * timeout)
	close(released)
	probe.WaitFor(t, 3*time.Second, 3, 5*time.Millisecond, func() bool {
		v, err := direct.Get(context.Background(), key).Result()
		return errors.Is(err, redis.Nil) && v == ""
	}, "node 4 keeps the released key until its TTL")
}

// countScript is a go-redis hook that counts the commands running one
// script.
type countScript struct {
	sha string
	n   *atomic.Int32
}

func (h countScript) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h countScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 1 && args[1] == h.sha {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
