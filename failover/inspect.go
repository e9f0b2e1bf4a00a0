package failover

import (
	"context"

	"github.com/redlease/redlease"
)

var (
	_ redlease.Inspector     = (*Strategy)(nil)
	_ redlease.ForceReleaser = (*Strategy)(nil)
)

// Inspect reports what the primary holds for key: its token, remaining
// TTL, fence counter and fair-mode waiters, in one round trip to the
// primary that writes nothing, bounded by redlease.DefaultCallBound or
// ctx, whichever ends first (see redlease.Inspector).
func (s *Strategy) Inspect(ctx context.Context, key string) (redlease.Inspection, error) {
	return s.p.Inspect(ctx, key)
}

// ForceRelease deletes key if it holds token, and publishes its release
// notice, in one round trip to the primary bounded by
// redlease.DefaultCallBound or ctx, whichever ends first (see
// redlease.ForceReleaser). It waits for no replica, as Release: a
// failover that loses the delete brings the holder's key back on the new
// primary, and the revocation is undone, not doubled (a holder that runs a
// Watcher counts its lock lost at the failover anyway).
func (s *Strategy) ForceRelease(ctx context.Context, key, token string) (redlease.ForceResult, error) {
	return s.p.ForceRelease(ctx, key, token)
}
