package primary

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/drift"
	"github.com/redlease/redlease/internal/script"
)

// ExtendBatch extends many keys in one pipelined round trip: one
// ExtendMany script call per script.MaxBatch keys (and one WAIT, which
// covers them all, when replicas are required). On a Cluster client, whose
// scripts may only touch keys of one slot, it pipelines one Extend call per
// key instead; go-redis sends each node its share in one round trip.
func (p *Primary) ExtendBatch(ctx context.Context, items []redlease.Extension) []redlease.Extended {
	out := make([]redlease.Extended, len(items))
	var valid []int
	for i, it := range items {
		if err := p.check(it.Key, it.Token, it.TTL); err != nil {
			out[i].Err = err
			continue
		}
		valid = append(valid, i)
	}
	if len(valid) == 0 {
		return out
	}
	start := p.cfg.Clock.Now()
	extended, err := p.extendMany(ctx, items, valid)
	for j, i := range valid {
		switch {
		case extended == nil:
			out[i].Err = p.fail(ctx, redlease.ErrUnavailable, err)
		case extended[j] != 1:
			out[i].Err = redlease.ErrNotHeld
		case err != nil: // extended, but not acknowledged by enough replicas
			out[i].Err = errors.Join(redlease.ErrUnavailable, err)
		default:
			until := start.Add(items[i].TTL - drift.Allowance(items[i].TTL, p.cfg.DriftFactor))
			if !p.cfg.Clock.Now().Before(until) {
				out[i].Err = fmt.Errorf("%w: no validity left after %v", redlease.ErrNotHeld, p.cfg.Clock.Now().Sub(start))
				continue
			}
			out[i].Grant = redlease.Grant{Until: until}
		}
	}
	return out
}

// batchCall is one command of an extension pipeline.
type batchCall struct {
	script *script.Script
	line   []any
	many   bool // ExtendMany (array reply) rather than Extend
}

// extendMany returns 1 or 0 for each item in valid, in order, and an error
// that errors.Is ErrNotReplicated if the replies came but WAIT fell short
// (nil replies and an error if the replies did not come).
func (p *Primary) extendMany(ctx context.Context, items []redlease.Extension, valid []int) ([]int64, error) {
	var calls []batchCall
	if p.cluster {
		for _, i := range valid {
			calls = append(calls, batchCall{script.Extend,
				script.Extend.Args(items[i].Key, items[i].Token, items[i].TTL.Milliseconds()), false})
		}
	} else {
		for rest := valid; len(rest) > 0; {
			n := min(len(rest), script.MaxBatch)
			keys := make([]any, n)
			args := make([]any, 0, 2*n)
			for j, i := range rest[:n] {
				keys[j] = items[i].Key
				args = append(args, items[i].Token, items[i].TTL.Milliseconds())
			}
			rest = rest[n:]
			calls = append(calls, batchCall{script.ExtendMany, script.ExtendMany.LineMany(keys, args), true})
		}
	}
	for attempt := 0; ; attempt++ {
		res, wait, err := p.pipeline(ctx, calls)
		if script.IsNoScript(err) && attempt == 0 {
			if err := calls[0].script.Load(ctx, p.client); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil {
			return nil, err
		}
		if len(res) != len(valid) {
			return nil, fmt.Errorf("extend batch: %d replies for %d keys", len(res), len(valid))
		}
		if wait != nil {
			return res, p.replicated(wait)
		}
		return res, nil
	}
}

// pipeline sends calls (and WAIT when replicas are required) in one round
// trip and returns the replies in order.
func (p *Primary) pipeline(ctx context.Context, calls []batchCall) ([]int64, *redis.Cmd, error) {
	pipe := p.client.Pipeline()
	cmds := make([]*redis.Cmd, len(calls))
	for i, c := range calls {
		cmds[i] = pipe.Do(ctx, c.line...)
	}
	var wait *redis.Cmd
	if p.cfg.Replicas > 0 {
		wait = pipe.Do(ctx, "WAIT", p.cfg.Replicas, p.cfg.WaitTimeout.Milliseconds())
	}
	_, _ = pipe.Exec(ctx) // errors are read per command
	var res []int64
	for i, c := range calls {
		if c.many {
			v, err := cmds[i].Int64Slice()
			if err != nil {
				return nil, nil, err
			}
			res = append(res, v...)
			continue
		}
		v, err := cmds[i].Int64()
		if err != nil {
			return nil, nil, err
		}
		res = append(res, v)
	}
	return res, wait, nil
}
