package faultproxy

import (
	"context"
	"net"
	"testing"
	"time"

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
func TestCutKeepsThePort(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	p := New(t, srv.Addr)
	c := p.Client()
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
		require.Eventually(t, func() bool { return c.Ping(ctx).Err() == nil }, 5*time.Second, 10*time.Millisecond,
			"round %d: the node answers after Heal", round)
		require.Less(t, time.Since(start), 5*time.Second)
	}
	// Heal removed the latency: a round trip well under its 200 ms.
	start := time.Now()
	require.NoError(t, c.Ping(ctx).Err())
	require.Less(t, time.Since(start), 150*time.Millisecond, "the latency toxic outlived Heal")
}
