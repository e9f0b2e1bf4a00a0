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

// Lock's wait ends (its ctx) while an attempt is on its way: the nodes'
// last answer was "held", and that is what Lock reports (with the ctx's
// cause), not "unavailable" — the CLI maps the two to different exit
// codes (75 and 69), and a key held by another is not a node down
// (TestExitCodes/75_held_by_another failed so once in a clean-clone CI).
// Forced order: the waiter's second acquisition is held in a gate until
// its ctx has ended.
func TestLockWaitEndingMidAttemptSaysHeld(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	gate := redistest.NewGate(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: gate.Addr})
	t.Cleanup(func() { _ = c.Close() })
	ctx := t.Context()
	locker := singleLocker(t, srv.Client(), redlease.WithTTL(30*time.Second))
	holder, err := locker.TryLock(ctx, "busy")
	require.NoError(t, err)
	l := singleLocker(t, c, redlease.WithTTL(30*time.Second), redlease.WithPolling())
	warm, err := l.TryLock(ctx, "warm-up") // scripts loaded, a connection open
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))

	gate.HoldRequests("busy")
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, err := l.Lock(wctx, "busy", redlease.WithRetryDelay(10*time.Millisecond, 10*time.Millisecond))
		got <- err
	}()
	require.NoError(t, gate.WaitHeld(1, "busy", 5*time.Second))
	require.NoError(t, gate.Step("busy", 5*time.Second)) // the first attempt: refused
	require.NoError(t, gate.WaitHeld(1, "busy", 5*time.Second))
	err = <-got // the second attempt is still held when the wait ends
	gate.Open()
	t.Logf("Lock: %v", err)
	assert.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotErrorIs(t, err, redlease.ErrUnavailable, "the last answer was 'held'; the wait ended, no node failed")
	require.NoError(t, holder.Release(ctx))
}
