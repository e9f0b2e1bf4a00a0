package redistest

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Precision is how far Expiry's answer may be from the key's expiry.
const Precision = time.Millisecond

// Expiry reads when key expires on the node c reaches, by the node's own
// clock: TIME and PTTL in one MULTI, so both are read at one instant of the
// server's and the answer does not depend on how long the read took to
// come back (a test that compares PTTL with a fixed threshold fails on a
// machine slow enough between its write and its read). at is the key's
// expiry to within a millisecond (PTTL counts whole milliseconds): compare
// it allowing Precision. The server's clock is this process's: every
// server here runs on this host.
// ok is false for a key that is absent or has no TTL. c must reach one
// node (a node's own client, not a ClusterClient).
func Expiry(ctx context.Context, c redis.Cmdable, key string) (at time.Time, ok bool, err error) {
	var now *redis.TimeCmd
	var left *redis.DurationCmd
	_, err = c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		left = p.PTTL(ctx, key)
		return nil
	})
	if err != nil {
		return time.Time{}, false, fmt.Errorf("redistest: TIME and PTTL of %q: %w", key, err)
	}
	d := left.Val()
	if d < 0 { // -1 ns: no TTL, -2 ns: absent (go-redis keeps Redis's codes)
		return time.Time{}, false, nil
	}
	return now.Val().Truncate(time.Millisecond).Add(d), true, nil
}
