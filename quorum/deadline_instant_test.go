package quorum_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/contract"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/quorum"
)

// An acquisition at its ctx's deadline instant, the deadline passed and
// the ctx's own timer not yet run (ctx.Err still nil), sends nothing: its
// round would only be undone, and whether its requests went out depended
// on which goroutine ran first. Forced order: the ctx here ends only once
// a node has run an acquire request (its timer runs after the fan-out's
// workers), so a round started at that instant always sends one; the
// library waits for the ctx to end, at most a node timeout (this one never
// ends without a request).
func TestAcquireAtItsDeadlineInstantSendsNothing(t *testing.T) {
	servers, clients := nodes(t, 3)
	var acquires atomic.Int32
	ctx := newInstantCtx()
	for _, c := range clients {
		c.AddHook(onScript{sha: script.Acquire.Hash(), after: func() {
			acquires.Add(1)
			ctx.end()
		}})
	}
	const timeout = 300 * time.Millisecond
	s := strategy(t, clients, quorum.WithNodeTimeout(timeout))
	key := contract.Key(t)

	start := time.Now()
	g, err := s.Acquire(ctx, key, "tok", 10*time.Second)
	elapsed := time.Since(start)
	assert.Zero(t, acquires.Load(), "no acquire request reaches a node")
	require.Error(t, err, "not granted: the caller's deadline had passed (granted until %v)", g.Until)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorIs(t, err, redlease.ErrUnavailable, "the error of a round that no node answered before ctx ended")
	assert.Less(t, elapsed, 2*timeout, "a ctx that does not end at its deadline holds the call at most a node timeout")
	for i, sv := range servers {
		n, err := sv.Client().Exists(context.Background(), key).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "node %d holds no key", i)
	}
}

// instantCtx is a context at its deadline's instant: its deadline has
// passed, and it ends (Err, Done) only when end is called.
type instantCtx struct {
	context.Context
	dl   time.Time
	done chan struct{}
	once sync.Once
}

func newInstantCtx() *instantCtx {
	return &instantCtx{Context: context.Background(), dl: time.Now(), done: make(chan struct{})}
}

func (c *instantCtx) Deadline() (time.Time, bool) { return c.dl, true }
func (c *instantCtx) Done() <-chan struct{}       { return c.done }
func (c *instantCtx) end()                        { c.once.Do(func() { close(c.done) }) }

func (c *instantCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// onScript runs after once a command calling the script sha (EVALSHA, or
// EVAL after NOSCRIPT) has returned.
type onScript struct {
	sha   string
	after func()
}

func (h onScript) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h onScript) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h onScript) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if args := cmd.Args(); len(args) > 1 && args[1] == h.sha {
			h.after()
		}
		return err
	}
}
