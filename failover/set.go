package failover

import (
	"context"
	"time"

	"github.com/redlease/redlease"
)

var _ redlease.SetAcquirer = (*Strategy)(nil)

// Together reports whether AcquireSet can take keys in one step: at most
// 500 of them and, on a Cluster client, all in one hash slot (see
// redlease.SetAcquirer).
func (s *Strategy) Together(keys []string) bool { return s.p.Together(keys) }

// AcquireSet takes every key of keys, or none, in one atomic script on the
// primary followed by WAIT in the same pipeline, as Acquire takes one key:
// a set that too few replicas acknowledged is released again and reported
// as an outage (redlease.ErrUnavailable and ErrNotReplicated), not as held
// (see redlease.SetAcquirer).
func (s *Strategy) AcquireSet(ctx context.Context, keys []string, token string, ttl time.Duration) ([]redlease.Grant, int, error) {
	return s.p.AcquireSet(ctx, keys, token, ttl)
}
