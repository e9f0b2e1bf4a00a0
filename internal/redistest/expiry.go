package redistest

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Precision is how far Expiry's answer may be from an instant of this
// process's clock that the key's expiry was computed from: the server
// keeps expiries in whole milliseconds.
const Precision = time.Millisecond

// Expiry reads when key expires on the node c reaches, as the node keeps
// it: PEXPIRETIME, the absolute instant in milliseconds (Redis 7.0 and
// later, and miniredis). No clock is read, so the answer depends neither
// on how long the read took (as a PTTL compared with a fixed threshold
// does) nor on the server being descheduled between two reads of its
// clock: TIME then PTTL in one MULTI are two reads (with DEBUG SLEEP 0.05
// between them the pair placed the expiry 51 ms early, and a run beside
// yes > /dev/null x2 and make test once 56 ms). The server's clock is
// this process's: every server here runs on this host. ok is false for a
// key that is absent or has no TTL. c must reach one node (a node's own
// client, not a ClusterClient).
func Expiry(ctx context.Context, c redis.Cmdable, key string) (at time.Time, ok bool, err error) {
	d, err := c.PExpireTime(ctx, key).Result()
	if err != nil {
		return time.Time{}, false, fmt.Errorf("redistest: PEXPIRETIME %q: %w", key, err)
	}
	if d < 0 { // -1 ns: no TTL, -2 ns: absent (go-redis keeps Redis's codes)
		return time.Time{}, false, nil
	}
	return time.UnixMilli(d.Milliseconds()), true, nil
}

// GivenBetween reports whether at, a key's expiry (Expiry), is ttl after
// an instant in [from, to], to within Precision: what a key given ttl by
// a write made between from and to has.
func GivenBetween(at, from, to time.Time, ttl time.Duration) bool {
	return !at.Before(from.Add(ttl-Precision)) && !at.After(to.Add(ttl+Precision))
}
