// Package bounded makes a Redis call return at its context's end even when
// the go-redis client ignores contexts on its sockets: without
// ContextTimeoutEnabled (go-redis's default) a call to a paused server waits
// for the client's read timeout (3 s by default) and its retries, whatever
// the context says.
package bounded

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"
)

// HonorsContext reports whether go-redis applies a context's deadline to
// the client's socket reads and writes (ContextTimeoutEnabled); for a
// client it cannot tell, it says no.
func HonorsContext(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// Abandoned is the error of a call that ctx ended before the client
// returned: the call goes on in the background, and may still be applied.
type Abandoned struct{ Cause error }

func (e Abandoned) Error() string {
	return "no reply before the context ended (" + e.Cause.Error() + "); the call may still be applied"
}

// Unwrap returns the context's cause.
func (e Abandoned) Unwrap() error { return e.Cause }

type result[T any] struct {
	v   T
	err error
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
	var mu sync.Mutex
	abandoned := false
	done := make(chan result[T], 1)
	go func() {
		v, err := f(ctx)
		mu.Lock()
		ab := abandoned
		if !ab {
			done <- result[T]{v, err} // buffered: never blocks
		}
		mu.Unlock()
		if ab && late != nil {
			late(v, err)
		}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case r := <-done: // it returned meanwhile: not abandoned
		return r.v, r.err
	default:
	}
	abandoned = true
	var zero T
	return zero, Abandoned{Cause: context.Cause(ctx)}
}
