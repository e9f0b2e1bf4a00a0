package single

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/drift"
	"github.com/redlease/redlease/internal/script"
)

var _ redlease.BatchExtender = (*Strategy)(nil)

// ExtendBatch extends many keys in one pipelined round trip: one
// ExtendMany script call per script.MaxBatch keys. On a Cluster client,
// whose scripts may only touch keys of one slot, it pipelines one Extend
// call per key instead (go-redis sends each node its share in one round
// trip).
func (s *Strategy) ExtendBatch(ctx context.Context, items []redlease.Extension) []redlease.Extended {
	out := make([]redlease.Extended, len(items))
	var valid []int
	for i, it := range items {
		if err := s.check(it.Key, it.Token, it.TTL); err != nil {
			out[i].Err = err
			continue
		}
		valid = append(valid, i)
	}
	if len(valid) == 0 {
		return out
	}
	start := time.Now()
	extended, err := s.extendMany(ctx, items, valid)
	for j, i := range valid {
		switch {
		case err != nil:
			out[i].Err = s.fail(redlease.ErrUnavailable, err)
		case extended[j] != 1:
			out[i].Err = redlease.ErrNotHeld
		default:
			until := start.Add(items[i].TTL - drift.Allowance(items[i].TTL, s.driftFactor))
			if !time.Now().Before(until) {
				out[i].Err = fmt.Errorf("%w: no validity left after %v", redlease.ErrNotHeld, time.Since(start))
				continue
			}
			out[i].Grant = redlease.Grant{Until: until}
		}
	}
	return out
}

// extendMany returns 1 or 0 for each item in valid, in order.
func (s *Strategy) extendMany(ctx context.Context, items []redlease.Extension, valid []int) ([]int64, error) {
	_, cluster := s.client.(*redis.ClusterClient)
	pipe := s.client.Pipeline()
	type call struct {
		cmd  *redis.Cmd
		line []any
		many bool
	}
	var calls []call
	if cluster {
		for _, i := range valid {
			line := script.Extend.Args(items[i].Key, items[i].Token, items[i].TTL.Milliseconds())
			calls = append(calls, call{pipe.Do(ctx, line...), line, false})
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
			line := script.ExtendMany.LineMany(keys, args)
			calls = append(calls, call{pipe.Do(ctx, line...), line, true})
		}
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below
	res := make([]int64, 0, len(valid))
	for _, c := range calls {
		switch {
		case c.many:
			v, err := c.cmd.Int64Slice()
			if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				v, err = script.ExtendMany.RunInts(ctx, s.client, c.line) // loads the script
			}
			if err != nil {
				return nil, err
			}
			res = append(res, v...)
		default:
			v, err := c.cmd.Int64()
			if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				v, err = script.Extend.Run(ctx, s.client, c.line)
			}
			if err != nil {
				return nil, err
			}
			res = append(res, v)
		}
	}
	if len(res) != len(valid) {
		return nil, fmt.Errorf("extend batch: %d replies for %d keys", len(res), len(valid))
	}
	return res, nil
}
