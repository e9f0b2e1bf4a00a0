package redlease

import (
	"context"
	"fmt"
	"time"
)

// Observer is told what locks do, for metrics, traces and logs. The
// observe package has one built on OpenTelemetry and log/slog. The default
// is none: a Locker without WithObserver makes no calls at all.
//
// Implementations must be safe for concurrent use and fast: they run on the
// path of every lock operation.
type Observer interface {
	// Start is called when an operation begins and returns a context for
	// it (carrying a span, say) and a function the Locker calls once when
	// the operation ends, with its error (nil on success).
	Start(ctx context.Context, op Op) (context.Context, func(err error))
	// Held is called once a lock is released or lost, with how long it was
	// held and why it ended (nil: released).
	Held(op Op, d time.Duration, lost error)
	// NodeFailed is called for every node that failed inside an operation,
	// whether or not the operation as a whole succeeded (a quorum grant
	// with one node down is still a node down).
	NodeFailed(ctx context.Context, op Op, ne *NodeError)
}

// Op describes one lock operation for an Observer.
type Op struct {
	Name     string // "acquire" (one attempt), "acquire_set" (one attempt at a set's keys in one step), "wait" (Lock: every attempt), "extend", "release"; an operator's "inspect", "force_release"
	Strategy string // the strategy's Name (see Namer), or its Go type
	Key      string // as the caller gave it; for "acquire_set", the set's keys joined by ","
	// Keys is, for "acquire_set", the set's keys in the order taken (as
	// the caller gave them); a grant makes one Lock of each, and each
	// reports its own Held. Nil for every other operation.
	Keys []string
	// Began is when the operation began, if that was before the call to
	// Observer.Start: a keeper's renewal (ExtendAll) is reported once its
	// round trip has ended, with Began set to when it was sent (by
	// time.Now, so that an Observer measures from it with time.Since).
	// Zero: the operation begins when Start is called.
	Began time.Time
}

// observe starts op on o, if there is one, with a sink for
// ReportNodeFailure in the returned context.
func observe(ctx context.Context, o Observer, op Op) (context.Context, func(error)) {
	if o == nil {
		return ctx, func(error) {}
	}
	ctx, done := o.Start(ctx, op)
	sink := func(ne *NodeError) { o.NodeFailed(ctx, op, ne) }
	return context.WithValue(ctx, nodeSinkKey{}, sink), done
}

// strategyName names a strategy for observers: its Name where it is a
// Namer, else its Go type.
func strategyName(s Strategy) string {
	if n, ok := s.(Namer); ok {
		return n.Name()
	}
	return fmt.Sprintf("%T", s)
}
