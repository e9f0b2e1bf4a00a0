package quorum

import (
	"context"
	"fmt"
	"slices"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/fanout"
	"github.com/redlease/redlease/internal/script"
)

var _ redlease.BatchExtender = (*Strategy)(nil)

// ExtendBatch extends many keys with one script call per node for every
// script.MaxBatch keys: a watchdog keeping ten thousand locks pays twenty
// calls per node per tick, not ten thousand. Each key is
// judged as Extend would judge it: extended on a quorum, with validity left.
//
// Every node answers for every key on its own, and each key is counted on
// its own: a node on which one key holds a value of another type (a hash
// where our string was; WRONGTYPE) refuses that key, as a node where the
// key is gone or not ours does, and still counts for every other key. Such
// a refusal is kept as the key's own cause (a *redlease.NodeError whose Err
// satisfies redis.HasErrorPrefix(err, "WRONGTYPE")), so that a key refused
// by enough nodes fails with ErrNotHeld and says why. Any other error a
// node reports for one key leaves that key undecided on that node. A node
// that fails as a whole (down, timed out) counts for none of its chunk's
// keys.
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
			agreed, refused, answered, causes, keyCauses := s.collectBatch(ctx, c.round, len(c.idx))
			c.round.Done()
			for j, i := range c.idx {
				t := tally{agreed: agreed[j], refused: refused[j], answered: answered, causes: causes}
				if keyCauses != nil && keyCauses[j] != nil {
					// This key's causes: the nodes that failed as a whole, then
					// its own. The shared list is copied, never appended to.
					t.causes = append(slices.Clip(causes), keyCauses[j]...)
				}
				until := start.Add(items[i].TTL - s.DriftAllowance(items[i].TTL))
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
// causes are the failures of whole nodes, shared by every item; keyCauses
// are each item's own, from nodes that answered for that item with
// something other than "extended" or "not ours" (nil when there are none).
func (s *Strategy) collectBatch(ctx context.Context, round *fanout.Round, items int) (agreed, refused []int, answered int, causes []error, keyCauses [][]error) {
	agreed, refused = make([]int, items), make([]int, items)
	addCause := func(j int, err error) {
		if keyCauses == nil {
			keyCauses = make([][]error, items)
		}
		keyCauses[j] = append(keyCauses[j], err)
	}
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
	dup := *s.dup.Load()
	record := func(node int) {
		r := round.Result(node)
		answered++
		replied[node] = true
		if r.Err == nil && len(r.Vals) != items {
			r.Err = fmt.Errorf("extend batch: %d replies for %d keys", len(r.Vals), items)
		}
		if r.Err == nil && dup[node] >= 0 {
			r.Err = errSameServer{of: dup[node]}
		}
		if r.Err != nil {
			causes = append(causes, s.nodeError(node, r.Err))
			return
		}
		for j, v := range r.Vals {
			switch v {
			case script.Extended:
				agreed[j]++
			case script.NotOurs:
				refused[j]++
			case script.WrongType: // not ours either, and worth naming
				refused[j]++
				addCause(j, s.nodeError(node, script.ErrWrongType))
			default: // an error on this key alone: undecided here
				ne := s.nodeError(node, script.KeyCause(v))
				redlease.ReportNodeFailure(ctx, ne)
				addCause(j, ne)
			}
		}
	}
	if await(ctx, round, decided, record) {
		causes = s.silent(causes, replied)
	}
	return
}
