package single

import (
	"context"

	"github.com/redlease/redlease"
)

var (
	_ redlease.Inspector     = (*Strategy)(nil)
	_ redlease.ForceReleaser = (*Strategy)(nil)
)

// Inspect reports what the primary holds for key: its token, remaining
// TTL, fence counter and fair-mode waiters, in one round trip that writes
// nothing, bounded by redlease.DefaultCallBound or ctx, whichever ends
// first (see redlease.Inspector).
func (s *Strategy) Inspect(ctx context.Context, key string) (redlease.Inspection, error) {
	return s.p.Inspect(ctx, key)
}

// ForceRelease deletes key if it holds token, and publishes its release
// notice, in one round trip bounded by redlease.DefaultCallBound or ctx,
// whichever ends first (see redlease.ForceReleaser).
func (s *Strategy) ForceRelease(ctx context.Context, key, token string) (redlease.ForceResult, error) {
	return s.p.ForceRelease(ctx, key, token)
}
