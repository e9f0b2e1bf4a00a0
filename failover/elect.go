package failover

import (
	"context"
	"time"

	"github.com/redlease/redlease"
)

var _ redlease.Elector = (*Strategy)(nil)

// Proclaim records an election's leader beside key while key holds token,
// in one round trip to the primary followed by WAIT for the replicas, as
// an acquisition is (a record too few replicas acknowledged is reported
// as ErrUnavailable), bounded by the strategy's call bound (the WAIT
// timeout included) or ctx, whichever ends first (see redlease.Elector).
func (s *Strategy) Proclaim(ctx context.Context, key, token string, term uint64, value string, ttl time.Duration, write bool) error {
	return s.p.Proclaim(ctx, key, token, term, value, ttl, write)
}

// Leader reads the leader of key's election on the primary, in one round
// trip that writes nothing, bounded by the strategy's call bound or ctx,
// whichever ends first (see redlease.Elector).
func (s *Strategy) Leader(ctx context.Context, key string) (redlease.Leader, error) {
	return s.p.Leader(ctx, key)
}

// WatchLeader subscribes to key's election on a connection of its own to
// the primary, confirmed within a second or ctx (see redlease.Elector).
func (s *Strategy) WatchLeader(ctx context.Context, key string) (redlease.LeaderWatch, error) {
	return s.p.WatchLeader(ctx, key)
}
