package single

import (
	"context"
	"time"

	"github.com/redlease/redlease"
)

var _ redlease.Elector = (*Strategy)(nil)

// Proclaim records an election's leader beside key while key holds token,
// in one round trip bounded by redlease.DefaultCallBound or ctx,
// whichever ends first (see redlease.Elector).
func (s *Strategy) Proclaim(ctx context.Context, key, token string, term uint64, value string, ttl time.Duration, write bool) error {
	return s.p.Proclaim(ctx, key, token, term, value, ttl, write)
}

// Leader reads the leader of key's election, in one round trip that writes
// nothing, bounded by redlease.DefaultCallBound or ctx, whichever ends
// first (see redlease.Elector).
func (s *Strategy) Leader(ctx context.Context, key string) (redlease.Leader, error) {
	return s.p.Leader(ctx, key)
}

// WatchLeader subscribes to key's election on a connection of its own,
// confirmed by the primary within a second or ctx (see redlease.Elector).
func (s *Strategy) WatchLeader(ctx context.Context, key string) (redlease.LeaderWatch, error) {
	return s.p.WatchLeader(ctx, key)
}
