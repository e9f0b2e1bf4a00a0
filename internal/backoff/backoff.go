// Package backoff is the jittered exponential backoff shared by the
// Locker's retries and the wake hub's pacing of undo notices.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Jittered returns the wait after attempt n (n >= 1): d = min(base ×
// 2^(n-1), limit), drawn uniformly from [d/2, d].
func Jittered(n int, base, limit time.Duration) time.Duration {
	d := base
	for i := 1; i < n && d < limit; i++ {
		if d > limit/2 {
			d = limit // doubling would pass the limit (or overflow)
			break
		}
		d *= 2
	}
	half := d / 2
	return half + rand.N(d-half+1)
}
