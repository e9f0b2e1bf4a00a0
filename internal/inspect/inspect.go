// Package inspect is the reading and the judging behind redlease.Inspector
// and redlease.ForceReleaser, shared by the strategies: one node's view of
// a key (Read), the verdict over every node's (Judge), and the outcome of
// a forced release over every node's answer (Forced). Asking the nodes
// (every one at once, each bounded) is Survey's.
package inspect

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/bounded"
	"github.com/redlease/redlease/internal/nodes"
	"github.com/redlease/redlease/internal/script"
)

// Read asks one node what it holds for key (script.Inspect: one atomic
// read) and returns its view, without Node, Addr and Err; a key no lock
// can have (script.CheckKey) is refused with redlease.ErrInvalid.
func Read(ctx context.Context, c script.Doer, key string) (redlease.NodeView, error) {
	if err := script.CheckKey(key); err != nil {
		return redlease.NodeView{}, err
	}
	v, err := script.Inspect.RunValue(ctx, c, script.InspectArgs(key))
	if err != nil {
		return redlease.NodeView{}, err
	}
	return parse(v)
}

// parse reads script.Inspect's reply.
func parse(v any) (redlease.NodeView, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 11 {
		return redlease.NodeView{}, fmt.Errorf("inspect: unexpected reply %v", v)
	}
	str := func(i int) string { s, _ := a[i].(string); return s }
	num := func(i int) int64 { n, _ := a[i].(int64); return n }
	var nv redlease.NodeView
	if num(0) == 1 {
		nv.Held, nv.Token = true, str(1)
		nv.TTL = time.Duration(num(2)) * time.Millisecond
		if nv.TTL < 0 {
			nv.TTL = -1 // no expiry
		}
	}
	nv.Fence, _ = strconv.ParseUint(str(3), 10, 64)
	nv.Waiters = int(num(4))
	if nv.Held && str(5) == nv.Token {
		rec := &redlease.HolderRecord{Token: str(5), Host: str(6), Command: str(9)}
		rec.PID, _ = strconv.Atoi(str(7))
		rec.Since, _ = time.Parse(time.RFC3339Nano, str(8))
		rec.Fence, _ = strconv.ParseUint(str(10), 10, 64)
		nv.Holder = rec
	}
	return nv, nil
}

// Node is one node to survey: its client, and whether the client returns
// by a call's ctx on its own (bounded.HonorsContext).
type Node struct {
	Client   redis.UniversalClient
	Honors   bool
	Excluded error // not asked, with this as its cause (Close, another entry's server)
}

// Survey runs ask on every node at once, each call bounded by ctx and by
// bound, and returns each node's outcome in node order once every call
// returned or was abandoned at its bound: whatever the clients' options,
// it returns within bound (or ctx's end). An abandoned call finishes in
// the background, at the client's own timeouts.
func Survey[T any](ctx context.Context, ns []Node, bound time.Duration, ask func(ctx context.Context, c redis.UniversalClient) (T, error)) ([]T, []error) {
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	vals, errs := make([]T, len(ns)), make([]error, len(ns))
	var wg sync.WaitGroup
	for i, n := range ns {
		if n.Excluded != nil {
			errs[i] = n.Excluded
			continue
		}
		wg.Go(func() {
			vals[i], errs[i] = bounded.Call(ctx, !n.Honors, func(ctx context.Context) (T, error) { return ask(ctx, n.Client) }, nil)
		})
	}
	wg.Wait()
	return vals, errs
}

// Judge gives the verdict on key over views (one per node, in node order;
// a view with Err did not answer, and is reported to ctx's Observer),
// quorum being a majority of them; the
// error is that of redlease.Inspector: ErrUnavailable (or ErrDenied) when
// fewer than quorum answered, with ctx's cause if ctx had ended.
func Judge(ctx context.Context, key string, views []redlease.NodeView, quorum int) (redlease.Inspection, error) {
	in := redlease.Inspection{Key: key, Nodes: views, Quorum: quorum}
	counts := map[string]int{}
	var causes []error
	for _, v := range views {
		switch {
		case v.Err != nil:
			ne := &redlease.NodeError{Node: v.Node, Addr: v.Addr, Err: v.Err}
			redlease.ReportNodeFailure(ctx, ne)
			causes = append(causes, ne)
			continue
		case v.Held:
			counts[v.Token]++
		default:
			in.Free++
		}
		in.Answered++
		in.Waiters = max(in.Waiters, v.Waiters)
	}
	for tok, n := range counts {
		if n > in.Holding || (n == in.Holding && tok < in.Token) {
			in.Token, in.Holding = tok, n
		}
	}
	for _, v := range views {
		if v.Err != nil || !v.Held || v.Token != in.Token || in.Holding == 0 {
			continue
		}
		in.Fence = max(in.Fence, v.Fence)
		switch {
		case in.Remaining < 0:
		case v.TTL < 0:
			in.Remaining = v.TTL
		default:
			in.Remaining = max(in.Remaining, v.TTL)
		}
		if in.Holder == nil && v.Holder != nil {
			in.Holder = v.Holder
			in.Since = v.Holder.Since
		}
	}
	switch {
	case in.Holding >= quorum:
		in.State = redlease.KeyHeld
	case in.Free >= quorum:
		in.State = redlease.KeyFree
	case in.Answered >= quorum:
		in.State = redlease.KeySplit
	default:
		in.State = redlease.KeyUnavailable
		return in, shortfall(ctx, "inspect", in.Answered, quorum, len(views), causes)
	}
	return in, nil
}

// Forced gives the outcome of a forced release of token on key over each
// node's answer (in node order: deleted[i] or errs[i]; a failed node is
// reported to ctx's Observer), quorum being a majority of them; the error
// is that of redlease.ForceReleaser.
func Forced(ctx context.Context, key, token string, addrs []string, deleted []bool, errs []error, quorum int) (redlease.ForceResult, error) {
	r := redlease.ForceResult{Key: key, Token: token, Quorum: quorum, Nodes: make([]redlease.ForcedNode, len(errs))}
	answered := 0
	var causes []error
	for i, err := range errs {
		r.Nodes[i] = redlease.ForcedNode{Node: i, Addr: addrs[i], Deleted: err == nil && deleted[i], Err: err}
		if err != nil {
			ne := &redlease.NodeError{Node: i, Addr: addrs[i], Err: err}
			redlease.ReportNodeFailure(ctx, ne)
			causes = append(causes, ne)
			continue
		}
		answered++
		if deleted[i] {
			r.Deleted++
		}
	}
	switch {
	case answered < quorum:
		return r, shortfall(ctx, "force release", answered, quorum, len(errs), causes)
	case r.Deleted == 0:
		return r, notHeld(ctx, quorum, len(errs), causes)
	}
	return r, nil
}

// notHeld is the error of a forced release that a majority answered and
// no node deleted anything: ErrNotHeld, with the failed nodes' causes.
func notHeld(ctx context.Context, quorum, n int, causes []error) error {
	return failure(ctx, "force release", redlease.ErrNotHeld, 0, quorum, n, causes)
}

// shortfall is the error of an operation that fewer than quorum of n
// nodes answered: ErrUnavailable, or ErrDenied when the nodes that denied
// the client alone leave too few; one node's cause is wrapped as it is
// (single, failover), several in a *redlease.QuorumError.
func shortfall(ctx context.Context, op string, answered, quorum, n int, causes []error) error {
	sentinel := redlease.ErrUnavailable
	denied := 0
	for _, c := range causes {
		var ne *redlease.NodeError
		if errors.As(c, &ne) && nodes.Denied(ne.Err) {
			denied++
		}
	}
	if denied > 0 && n-denied < quorum {
		sentinel = redlease.ErrDenied
	}
	return failure(ctx, op, sentinel, answered, quorum, n, causes)
}

// failure is the error of an operation on n nodes that ended in sentinel,
// votes of them having answered: sentinel alone without causes, one
// node's cause wrapped as it is (single, failover), several in a
// *redlease.QuorumError; with ctx's cause if ctx had ended.
func failure(ctx context.Context, op string, sentinel error, votes, quorum, n int, causes []error) error {
	var err error
	switch {
	case len(causes) == 0:
		err = sentinel
	case n == 1:
		err = redlease.Wrap(sentinel, causes[0])
	default:
		err = &redlease.QuorumError{Action: op, Votes: votes, Quorum: quorum, Nodes: n, Err: sentinel, Causes: causes}
	}
	if ctx.Err() != nil {
		err = redlease.Wrap(err, context.Cause(ctx))
	}
	return err
}
