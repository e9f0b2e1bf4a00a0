package quorum

import (
	"context"
	"fmt"

	"github.com/hashicorp/go-multierror"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/drift"
	"github.com/redlease/redlease/internal/fanout"
	"github.com/redlease/redlease/internal/script"
)

var _ redlease.BatchExtender = (*Strategy)(nil)

// ExtendBatch extends many keys with one script call per node for every
// script.MaxBatch keys: a watchdog keeping ten thousand locks pays twenty
// calls per node per tick, not ten thousand. Each key is
// judged as Extend would judge it: extended on a quorum, with validity left.
func (s *Strategy) ExtendBatch(ctx context.Context, items []redlease.Extension) []redlease.Extended {
	out := make([]redlease.Extended, len(items))
	valid := make([]int, 0, len(items))
	for i, it := range items {
		if err := script.Check(it.Key, it.Token, it.TTL, s.driftFactor); err != nil {
			out[i].Err = err
			continue
		}
		if err := s.checkTTL(it.TTL); err != nil {
			out[i].Err = err
			continue
		}
		valid = append(valid, i)
	}
	// Chunks go out in waves of as many as a node has workers, each wave
	// under its own round deadline: ten thousand locks are twenty chunks, a
	// hundred thousand two hundred, and a node works through them a few at a
	// time; one shared deadline for all of them would expire the last ones
	// in the queue.
	for len(valid) > 0 {
		start := s.clock.Now()
		type chunk struct {
			idx   []int
			round *fanout.Round
		}
		var wave []chunk
		for len(valid) > 0 && len(wave) < s.workers {
			n := min(len(valid), script.MaxBatch)
			idx := valid[:n]
			valid = valid[n:]
			keys := make([]any, len(idx))
			args := make([]any, 0, 2*len(idx))
			for j, i := range idx {
				keys[j] = items[i].Key
				args = append(args, items[i].Token, items[i].TTL.Milliseconds())
			}
			line := script.ExtendMany.LineMany(keys, args)
			wave = append(wave, chunk{idx, s.fan.Start(ctx,
				fanout.Call{Script: script.ExtendMany, Line: line, Multi: true}, fanout.Call{})})
		}
		for _, c := range wave {
			agreed, refused, answered, causes := s.collectBatch(ctx, c.round, len(c.idx))
			for j, i := range c.idx {
				t := tally{agreed: agreed[j], refused: refused[j], answered: answered, causes: causes}
				until := start.Add(items[i].TTL - drift.Allowance(items[i].TTL, s.driftFactor))
				switch {
				case t.agreed < s.quorum:
					out[i].Err = s.failure(ctx, "extend", s.heldOrUnknown(t), t, start, false)
				case !s.clock.Now().Before(until):
					out[i].Err = s.failure(ctx, "extend", redlease.ErrNotHeld, t, start, true)
				default:
					out[i].Grant = redlease.Grant{Until: until}
				}
			}
		}
	}
	return out
}

// collectBatch counts the replies of an ExtendMany round item by item, until
// every item is decided, the round's deadline passes, or ctx is done.
func (s *Strategy) collectBatch(ctx context.Context, round *fanout.Round, items int) (agreed, refused []int, answered int, causes *multierror.Error) {
	agreed, refused = make([]int, items), make([]int, items)
	n := len(s.nodes)
	replied := make([]bool, n)
	decided := func() bool {
		for j := range items {
			if agreed[j] < s.quorum && agreed[j]+n-answered >= s.quorum {
				return false
			}
		}
		return true
	}
	record := func(node int) {
		r := round.Result(node)
		answered++
		replied[node] = true
		if r.Err == nil && len(r.Vals) != items {
			r.Err = fmt.Errorf("extend batch: %d replies for %d keys", len(r.Vals), items)
		}
		if r.Err != nil {
			causes = multierror.Append(causes, s.nodeError(node, r.Err))
			return
		}
		for j, v := range r.Vals {
			if v == 1 {
				agreed[j]++
			} else {
				refused[j]++
			}
		}
	}
	if await(ctx, round, decided, record) {
		causes = s.silent(causes, replied)
	}
	return
}
