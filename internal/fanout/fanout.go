// Package fanout runs one call per node in parallel and lets the caller
// decide from the first replies, without ever waiting on a node that does not
// answer.
//
// go-redis applies a context deadline to socket reads only when the client
// has ContextTimeoutEnabled; otherwise a paused node holds a call until the
// client's ReadTimeout (3 s by default). So a Fan never blocks its caller on
// a call: the caller selects on Results and its own timer, and calls that
// outlive the decision finish in the background, counted by the owner's
// WaitGroup so the owner can wait for them when it closes.
package fanout

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Result is one node's reply.
type Result[T any] struct {
	Node int
	Val  T
	Err  error
}

// Fan is one round of calls, one per node.
type Fan[T any] struct {
	results chan Result[T]
	decided chan struct{}
	once    sync.Once
	undo    bool // written before decided is closed
	undone  chan int
	cancel  context.CancelFunc // ends the calls' shared deadline; run by the last call to return
}

// Start calls call(ctx, i) for every node i in [0, n), each in its own
// goroutine counted by wg, under one deadline timeout from now. If undo is
// not nil and the caller later decides with Decide(true), each goroutine runs
// undo for its node after its own call has returned (never concurrently
// with it), under a fresh deadline that ignores the cancellation of ctx.
func Start[T any](ctx context.Context, wg *sync.WaitGroup, n int, timeout time.Duration,
	call func(ctx context.Context, node int) (T, error),
	undo func(ctx context.Context, node int, r Result[T]),
) *Fan[T] {
	f := &Fan[T]{
		results: make(chan Result[T], n),
		decided: make(chan struct{}),
		undone:  make(chan int, n),
	}
	var callCtx context.Context
	callCtx, f.cancel = context.WithTimeout(ctx, timeout)
	var running atomic.Int32
	running.Store(int32(n))
	for i := range n {
		wg.Go(func() {
			defer func() {
				if running.Add(-1) == 0 {
					f.cancel()
				}
			}()
			v, err := call(callCtx, i)
			r := Result[T]{Node: i, Val: v, Err: err}
			f.results <- r // buffered for n: never blocks
			if undo == nil {
				return
			}
			<-f.decided
			if f.undo {
				uctx, ucancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
				undo(uctx, i, r)
				ucancel()
			}
			f.undone <- i
		})
	}
	return f
}

// Results delivers each node's reply once, in the order they arrive.
func (f *Fan[T]) Results() <-chan Result[T] { return f.results }

// Decide tells the calls' goroutines whether to undo. Only the first call
// counts. Every Fan started with an undo function must be decided, or its
// goroutines wait forever.
func (f *Fan[T]) Decide(undo bool) {
	f.once.Do(func() {
		f.undo = undo
		close(f.decided)
	})
}

// WaitUndone waits until the undo of each node in nodes has finished, or
// until the deadline passes, whichever is first. Nodes whose call has not
// returned yet are undone in the background later.
func (f *Fan[T]) WaitUndone(nodes int, deadline time.Duration) {
	t := time.NewTimer(deadline)
	defer t.Stop()
	for range nodes {
		select {
		case <-f.undone:
		case <-t.C:
			return
		}
	}
}
