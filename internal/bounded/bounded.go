// Package bounded makes a Redis call return at its context's end even when
// the go-redis client ignores contexts on its sockets: without
// ContextTimeoutEnabled (go-redis's default) a call to a paused server waits
// for the client's read timeout (3 s by default) and its retries, whatever
// the context says. Deadlines gives a call whose context has no deadline
// one, shared with the calls that start around the same time.
package bounded

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// HonorsContext reports whether a call through c returns by its
// context's end: a *redis.Client with ContextTimeoutEnabled (go-redis then
// applies the deadline to its socket reads and writes). A ClusterClient
// does not, whatever its options: with ContextTimeoutEnabled and its
// routing policies on (go-redis's default) its first routed command
// fetches COMMAND on a context of its own with a 5 s timeout, not the
// caller's, and with a master that does not answer the call returns only
// then. For a client it cannot tell, it says no.
func HonorsContext(c redis.UniversalClient) bool {
	if c, ok := c.(*redis.Client); ok {
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// Abandoned is the error of a call that ctx ended before the client
// returned, or whose client returned ctx's end (its error or cause): the
// call goes on in the background, or is over, and may still be applied;
// its Job's Late runs with its outcome either way.
type Abandoned struct{ Cause error }

func (e Abandoned) Error() string {
	return "no reply before the context ended (" + e.Cause.Error() + "); the call may still be applied"
}

// Unwrap returns the context's cause.
func (e Abandoned) Unwrap() error { return e.Cause }

// Job is a call that Cells.Call makes: Do sends it; Late runs, once Do
// has returned, with the outcome of a call that its ctx abandoned — an
// undo that identifies exactly what the call wrote, or nothing.
type Job[T any] interface {
	Do(ctx context.Context) (T, error)
	Late(v T, err error)
}

// Call runs f, and returns when it does or, if bound, when ctx is done,
// whichever comes first. An abandoned call finishes in the background
// (bounded by the client's own timeouts, or its Close) and then late, if
// not nil, runs with its outcome — an undo that identifies exactly what
// the call wrote. Unbound (a client that honours contexts), or with a ctx
// that never ends, f runs on the caller's goroutine.
func Call[T any](ctx context.Context, bound bool, f func(context.Context) (T, error), late func(T, error)) (T, error) {
	if !bound || ctx.Done() == nil {
		return f(ctx)
	}
	return run(ctx, newCell[T](nil), funcJob[T]{f, late})
}

// funcJob is the Job of Call.
type funcJob[T any] struct {
	f    func(context.Context) (T, error)
	late func(T, error)
}

func (j funcJob[T]) Do(ctx context.Context) (T, error) { return j.f(ctx) }

func (j funcJob[T]) Late(v T, err error) {
	if j.late != nil {
		j.late(v, err)
	}
}

// Cells makes calls like Call, from Jobs, and hands each bounded call to
// its goroutine in a cell reused from call to call: a bounded call costs
// no allocation of its own once the cells are warm. The zero value is
// ready; it is safe for concurrent use.
type Cells[T any] struct{ pool sync.Pool }

// Call runs j.Do, and returns when it does or, if bound, when ctx is
// done, whichever comes first; an abandoned call finishes in the
// background and then runs j.Late with its outcome (see Call). Unbound,
// or with a ctx that never ends, j.Do runs on the caller's goroutine.
func (cs *Cells[T]) Call(ctx context.Context, bound bool, j Job[T]) (T, error) {
	if !bound || ctx.Done() == nil {
		return j.Do(ctx)
	}
	c, _ := cs.pool.Get().(*cell[T])
	if c == nil {
		c = newCell[T](&cs.pool)
	}
	return run(ctx, c, j)
}

// The states of a cell's call.
const (
	running   = iota
	delivered // the goroutine handed the outcome over (done)
	abandoned // the caller left: the goroutine runs Late and frees the cell
)

// cell carries one bounded call between its caller and its goroutine.
// Whoever ends a call's use of the cell (the caller after done, or the
// goroutine of an abandoned call after Late) clears it and puts it back
// in pool, if any; nobody touches it after that.
type cell[T any] struct {
	state atomic.Int32
	done  chan struct{} // one send per delivered call
	exec  func()        // the goroutine's function, made once per cell
	pool  *sync.Pool

	ctx context.Context
	job Job[T]
	v   T
	err error
}

func newCell[T any](pool *sync.Pool) *cell[T] {
	c := &cell[T]{done: make(chan struct{}, 1), pool: pool}
	c.exec = c.do
	return c
}

// run starts c's goroutine on j and waits for it or ctx, whichever ends
// first. A job that returns an error of ctx's end (it gave up waiting as
// ctx ended) is abandoned too, its Late run with that outcome: ctx's end
// wakes the job and the caller at one instant, and the call reports the
// same whichever of the two runs first.
func run[T any](ctx context.Context, c *cell[T], j Job[T]) (T, error) {
	c.ctx, c.job = ctx, j
	c.state.Store(running)
	go c.exec() // a func value made once: the go statement allocates nothing
	var zero T
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(running, abandoned) {
			return zero, Abandoned{Cause: context.Cause(ctx)}
		}
		<-c.done // it returned meanwhile: not abandoned
	}
	v, err := c.v, c.err
	c.free()
	if err != nil && endedBy(ctx, err) {
		go j.Late(v, err) // as the cell's goroutine runs it for an abandoned call
		return zero, Abandoned{Cause: context.Cause(ctx)}
	}
	return v, err
}

// endedBy reports whether err is ctx's end: ctx ended, and err is its
// error or its cause.
func endedBy(ctx context.Context, err error) bool {
	cerr := ctx.Err()
	if cerr == nil {
		return false
	}
	return errors.Is(err, cerr) || errors.Is(err, context.Cause(ctx))
}

// do is the goroutine of a call: it runs the job and hands the outcome to
// the caller, or, if the caller left, to the job's Late.
func (c *cell[T]) do() {
	v, err := c.job.Do(c.ctx)
	c.v, c.err = v, err
	if c.state.CompareAndSwap(running, delivered) {
		c.done <- struct{}{} // buffered: never blocks; the cell is the caller's now
		return
	}
	j := c.job
	c.free()
	j.Late(v, err)
}

// free clears c and puts it back in its pool.
func (c *cell[T]) free() {
	var zero T
	c.ctx, c.job, c.v, c.err = nil, nil, zero, nil
	if c.pool != nil {
		c.pool.Put(c)
	}
}
