package bounded

import (
	"context"
	"sync/atomic"
	"time"
)

// Deadlines bounds calls whose context has no deadline: each gets one at
// most d after it starts, and no earlier than d less a 64th of d. The
// calls that start within that 64th share one deadline context, so that a
// call from a context that can never end (context.Background, or one made
// from it with values only) costs no timer of its own: none from
// context.Background, one small allocation from a context with values.
// A context that can end by cancellation gets a context.WithDeadline of
// its own. Deadlines is safe for concurrent use; one made inside a
// testing/synctest bubble serves that bubble only, like any context.
type Deadlines struct {
	d     time.Duration
	grain time.Duration
	cur   atomic.Pointer[sharedDeadline]
}

// sharedDeadline is a deadline context shared by the calls that start
// within a grain of each other.
type sharedDeadline struct {
	ctx    context.Context // context.WithDeadline(context.Background(), at)
	at     time.Time
	cancel context.CancelFunc // never called: the context ends at its deadline
}

// NewDeadlines returns Deadlines of d.
func NewDeadlines(d time.Duration) *Deadlines {
	return &Deadlines{d: d, grain: d / 64}
}

// D is the bound.
func (ds *Deadlines) D() time.Duration { return ds.d }

// Bound returns ctx if it has a deadline, and otherwise a context made
// from it that ends at most D from now (and no earlier than D less a 64th
// of D), with ctx's values, that ends when ctx does. Call the cancel
// function when the call is done.
func (ds *Deadlines) Bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, nothing
	}
	at := time.Now().Add(ds.d)
	if ctx.Done() != nil {
		return context.WithDeadline(ctx, at)
	}
	s := ds.shared(at)
	if ctx == context.Background() {
		return s.ctx, nothing
	}
	return &withValues{Context: s.ctx, values: ctx}, nothing
}

// shared returns a shared deadline in (at − grain, at], making one if the
// current one is not.
func (ds *Deadlines) shared(at time.Time) *sharedDeadline {
	if s := ds.cur.Load(); s != nil && !s.at.After(at) && at.Sub(s.at) < ds.grain {
		return s
	}
	s := &sharedDeadline{at: at}
	s.ctx, s.cancel = context.WithDeadline(context.Background(), at)
	// Two calls racing here may each store their own: either is right for
	// the calls that find it.
	ds.cur.Store(s)
	return s
}

func nothing() {}

// withValues is a shared deadline context with the values of a context
// that can never end.
type withValues struct {
	context.Context // the deadline
	values          context.Context
}

func (c *withValues) Value(key any) any { return c.values.Value(key) }

// AfterFunc lets a context made from c (context.WithCancel, WithTimeout)
// follow the deadline without a goroutine (see context.AfterFunc).
func (c *withValues) AfterFunc(f func()) func() bool { return context.AfterFunc(c.Context, f) }
