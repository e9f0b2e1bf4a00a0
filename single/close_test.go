package single_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/primary"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/single"
)

// Close returns within its 100 ms while a waiter is subscribed on a server
// that was paused before the waiter came: the release-notice connection is
// then inside go-redis's dial, whose handshake waits for a reply the paused
// server never sends while it holds the lock that closing the connection
// needs. The order is forced: the test waits until the server's accept
// queue holds that connection. With and without ContextTimeoutEnabled.
func TestCloseIsBoundedWithAWaiterOnAPausedServer(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	const margin = 500 * time.Millisecond // scheduling on a loaded machine; the old wait was 2 s
	for _, cte := range []bool{true, false} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%v", cte), func(t *testing.T) {
			srv := redistest.Start(t, redistest.Config{})
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: cte})
			t.Cleanup(func() { _ = c.Close() })
			s, err := single.New(c)
			require.NoError(t, err)

			srv.Pause()
			t.Cleanup(srv.Resume)
			wctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			_, stop, err := s.Watch(wctx, "close:paused", "") // returns at wctx, still subscribed
			require.NoError(t, err)
			defer stop(false)
			var queued int
			var qerr error
			probe.WaitFor(t, 10*time.Second, 3, 5*time.Millisecond, func() bool {
				queued, qerr = srv.Unaccepted()
				return qerr != nil || queued > 0
			}, "no connection to the paused server")
			require.NoError(t, qerr)

			start := time.Now()
			require.NoError(t, s.Close())
			took := time.Since(start)
			t.Logf("Close took %v (bound %v; %d connection(s) waiting on the paused server)", took.Round(time.Millisecond), primary.CloseWait, queued)
			if ok, why := probe.Within(took, primary.CloseWait+margin, 3, start); !ok {
				assert.Failf(t, "outside the window derived from this run", "Close waited past its %v for a connection held by a paused server: %s", primary.CloseWait, why)
			}
		})
	}
}
