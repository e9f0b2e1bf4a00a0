package redlease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/single"
)

// rateClock runs at rate times real time from start.
type rateClock struct {
	start time.Time
	rate  float64
}

func (c rateClock) Now() time.Time {
	return c.start.Add(time.Duration(float64(time.Since(c.start)) * c.rate))
}

// Audit issue 27, defect 3: an Extend whose answer never came capped the
// lock's Until with a fixed 5 % drift allowance, whatever the strategy's
// drift factor said. With WithDriftFactor(0.1) and the client's clock
// 8.7 % slow (as if the server's ran 8.7 % fast: inside the 10 % the
// strategy allows for), the key expired while the lock still counted
// itself Valid. Forced order: A holds the key with a 20 s TTL (loss margin
// 10 ms); its Extend to 4 s reaches the server, which applies it, but the
// reply is held in the gate until the Extend's ctx ends; B polls for the
// key, and may only get it once A's lock is no longer Valid.
func TestUndecidedExtendUsesTheStrategysDriftAllowance(t *testing.T) {
	ctx := t.Context()
	srv := redistest.Start(t, redistest.Config{})
	loadScripts(t, srv.Client())
	gate := redistest.NewGate(t, srv.Addr)
	clock := rateClock{start: time.Now(), rate: 1 - 0.087}
	sa, err := single.New(gate.Client(), single.WithDriftFactor(0.1), single.WithClock(clock))
	require.NoError(t, err)
	la := newLocker(t, sa, redlease.WithTTL(20*time.Second), redlease.WithLossMargin(10*time.Millisecond), redlease.WithClock(clock))
	lb := singleLocker(t, srv.Client(), redlease.WithTTL(20*time.Second))
	const key = "attack:undecided-drift"
	a, err := la.TryLock(ctx, key)
	require.NoError(t, err)

	gate.HoldReplies(script.Extend.Hash())
	ectx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	extErr := a.Extend(ectx, 4*time.Second)
	cancel()
	require.Error(t, extErr)
	require.NotErrorIs(t, extErr, redlease.ErrNotHeld, "undecided, not refused")
	require.Equal(t, 1, gate.HeldContaining(""), "the Extend's reply is held")
	pttl, err := srv.Client().PTTL(ctx, key).Result()
	require.NoError(t, err)
	require.LessOrEqual(t, pttl, 4*time.Second, "the Extend reached the server and was applied there")

	noSecondHolderWhileValid(t, nil, lb, a, key, clock)
}
