package redlease_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
)

// Audit issue 27, defect 4: Do's release after fn was bounded by the
// lock's TTL, so a primary that paused as fn returned held Do for the
// whole TTL (30 s by default). Forced order: fn stops the server (SIGSTOP)
// and returns; Do's release gets no answer. Do must return within the
// strategy's call bound, far sooner than the 20 s TTL, whether the client
// applies ctx deadlines to its sockets (ContextTimeoutEnabled) or not. The
// client's read timeout is longer than the TTL, so that go-redis's own
// timeouts and retries (about 10 s with its defaults) cannot end the
// release first and hide the bound Do sets.
func TestDoReleaseIsBoundedByTheCallBound(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	const ttl = 20 * time.Second
	for _, ctxTimeouts := range []bool{true, false} {
		name := "ContextTimeoutEnabled"
		if !ctxTimeouts {
			name = "without ContextTimeoutEnabled"
		}
		t.Run(name, func(t *testing.T) {
			srv := redistest.Start(t, redistest.Config{})
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: ctxTimeouts, ReadTimeout: 2 * ttl})
			t.Cleanup(func() { _ = c.Close() })
			t.Cleanup(srv.Resume) // before the client closes and the server is killed
			l := singleLocker(t, c, redlease.WithTTL(ttl))
			var paused time.Time
			err := l.Do(t.Context(), "attack:do-release", func(ctx context.Context, lk *redlease.Lock) error {
				srv.Pause()
				paused = time.Now()
				return nil
			})
			elapsed := time.Since(paused)
			require.NoError(t, err, "a failed release after fn is not reported")
			require.False(t, paused.IsZero(), "fn ran")
			if ok, why := probe.Within(elapsed, ttl/2, 3, paused); !ok {
				assert.Failf(t, "outside the window derived from this run", "Do returned %v after the server paused, with a %v TTL: %s", elapsed, ttl, why)
			}
			t.Logf("Do returned %v after the server paused", elapsed.Round(time.Millisecond))
		})
	}
}
