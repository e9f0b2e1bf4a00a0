package faultproxy

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease/internal/redistest"
)

// TestMain checks for leaked goroutines, but for the one toxiproxy's
// latency toxic may leave blocked on a send when its link closes mid-chunk
// (toxics/latency.go, v2.12.0; see chaos's TestMain).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*LatencyToxic).Pipe"))
}

// Cut keeps the proxy's port: nobody else can listen there before Heal, so
// Heal cannot fail with "bind: address already in use" (it once did, in
// TestScenario03's with_rule case, when Cut stopped the toxiproxy and Heal
// started it again on the same port). Toxics set before a Cut are gone
// after Heal.
//
// The client makes one dial per PING and no retries, so that a PING to the
// cut node fails at once (go-redis's defaults, five dials a command with
// 100 ms between them and three retries, took the 2 s bound every round).
// Waits are bounded by a window derived from the stall this process was
// measured to suffer (redistest.StallProbe), not by a fixed time.
func TestCutKeepsThePort(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	p := New(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: p.Addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	for round := range 3 {
		require.NoError(t, c.Ping(ctx).Err(), "round %d: before the Cut", round)
		p.Latency("slow", 200, 0)
		p.Cut()
		pingCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := c.Ping(pingCtx).Err()
		cancel()
		require.Error(t, err, "round %d: a cut node answers nothing", round)
		ln, err := net.Listen("tcp", p.Addr)
		if err == nil {
			_ = ln.Close()
		}
		require.Error(t, err, "round %d: the port must stay the proxy's while it is cut", round)
		p.Heal()
		start := time.Now()
		for tries := 0; c.Ping(ctx).Err() != nil; tries++ {
			now := time.Now()
			require.LessOrEqual(t, now.Sub(start), probe.Allowance(5*time.Second, 3, start, now),
				"round %d: the node does not answer after Heal (%d PINGs): %s", round, tries+1, probe.Explain(5*time.Second, 3, start, now))
			time.Sleep(10 * time.Millisecond)
		}
	}
	// Heal removed the latency: none is left on the proxy, and a round
	// trip takes well under its 200 ms (150 ms plus whatever this process
	// was measured stalled meanwhile).
	require.Empty(t, p.proxy.Toxics.GetToxicArray(), "the latency toxic outlived Heal")
	start := time.Now()
	require.NoError(t, c.Ping(ctx).Err())
	end := time.Now()
	require.Less(t, end.Sub(start), probe.Allowance(150*time.Millisecond, 1, start, end),
		"the latency toxic outlived Heal: %s", probe.Explain(150*time.Millisecond, 1, start, end))
}
