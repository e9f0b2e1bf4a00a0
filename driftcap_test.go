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

// frozenClock always reads the same instant: every extension then starts
// at it, so the bounds the lock takes from them are exact.
type frozenClock struct{ at time.Time }

func (c frozenClock) Now() time.Time { return c.at }

// Audit issue 27, defect 3: an Extend whose answer never came capped the
// lock's Until with a fixed 5 % drift allowance, whatever the strategy's
// drift factor said; with WithDriftFactor(0.1) and a clock 8.7 % slow, a
// key cut back by the extension expired while the lock still counted
// itself Valid. The nodes no longer cut a held key back (the key keeps
// its 20 s here), but the lock still bounds itself as if they could:
// Until becomes the extension's start plus 4 s less the strategy's own
// allowance for 4 s (0.1 × 4 s + 2 ms), exactly, on a clock that does not
// move. Forced order: A holds the key with a 20 s TTL (loss margin 10 ms);
// its Extend to 4 s reaches the server, which applies it, but the reply
// is held in the gate until the Extend's ctx ends. B is refused until A
// releases.
func TestUndecidedExtendUsesTheStrategysDriftAllowance(t *testing.T) {
	ctx := t.Context()
	srv := redistest.Start(t, redistest.Config{})
	loadScripts(t, srv.Client())
	gate := redistest.NewGate(t, srv.Addr)
	clock := frozenClock{at: time.Now()}
	sa, err := single.New(gate.Client(), single.WithDriftFactor(0.1), single.WithClock(clock))
	require.NoError(t, err)
	la := newLocker(t, sa, redlease.WithTTL(20*time.Second), redlease.WithLossMargin(10*time.Millisecond), redlease.WithClock(clock))
	lb := singleLocker(t, srv.Client(), redlease.WithTTL(20*time.Second))
	const key = "attack:undecided-drift"
	a, err := la.TryLock(ctx, key)
	require.NoError(t, err)
	require.Equal(t, clock.at.Add(20*time.Second-sa.DriftAllowance(20*time.Second)), a.Until())

	gate.HoldReplies(script.Extend.Hash())
	ectx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	extErr := a.Extend(ectx, 4*time.Second)
	cancel()
	require.Error(t, extErr)
	require.NotErrorIs(t, extErr, redlease.ErrNotHeld, "undecided, not refused")
	require.Equal(t, 1, gate.HeldContaining(""), "the Extend's reply is held")
	require.Equal(t, 402*time.Millisecond, sa.DriftAllowance(4*time.Second))
	require.Equal(t, clock.at.Add(4*time.Second-402*time.Millisecond), a.Until(),
		"the undecided extension bounds the lock by the strategy's allowance")
	pttl, err := srv.Client().PTTL(ctx, key).Result()
	require.NoError(t, err)
	require.Greater(t, pttl, 15*time.Second, "the Extend reached the server and left the key's longer life")

	require.True(t, a.Valid())
	_, err = lb.TryLock(ctx, key)
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	gate.Open()
	require.NoError(t, a.Release(ctx))
	b, err := lb.TryLock(ctx, key)
	require.NoError(t, err, "released: B may take it")
	require.NoError(t, b.Release(ctx))
}
