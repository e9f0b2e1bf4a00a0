package quorum

import (
	"context"
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/fanout"
	"github.com/redlease/redlease/internal/script"
)

var _ redlease.Queuer = (*Strategy)(nil)

// AcquireInLine is Acquire in fair mode (see redlease.Queuer and the
// package documentation): every node joins the waiter to its own line for
// key at place's ticket and grants a free key only to its line's head; a
// grant still needs a quorum. A round that fell short with some nodes
// refusing because others were ahead errors.Is redlease.ErrQueued.
func (s *Strategy) AcquireInLine(ctx context.Context, key, token string, ttl time.Duration, place redlease.Place) (redlease.Grant, error) {
	if err := script.CheckPlace(place); err != nil {
		return redlease.Grant{}, err
	}
	return s.acquire(ctx, key, token, ttl, &place)
}

// LeaveLine removes waiter id's entry from key's line on every node, in
// parallel, and returns once a quorum applied it, or at the node timeout
// or ctx's end; requests still in flight finish in the background,
// bounded by the node timeout. It fails with redlease.ErrUnavailable if
// too few nodes answered; a node that missed it keeps the entry until its
// lifetime.
func (s *Strategy) LeaveLine(ctx context.Context, key, id string) error {
	if key == "" || id == "" {
		return redlease.Invalid("empty key or waiter id")
	}
	start := s.clock.Now()
	round := s.fan.Start(ctx, fanout.Call{Script: script.Leave, Line: script.LeaveArgs(key, id)}, fanout.Call{})
	t := s.collect(ctx, round, func(int64) (bool, error) { return true, nil })
	round.Done()
	if t.agreed >= s.quorum {
		return nil
	}
	return s.failure(ctx, "leave line", redlease.ErrUnavailable, t, start, false)
}
