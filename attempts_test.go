package redlease_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
)

// Lock's attempts have tokens of their own (so that a failed attempt's late
// undo cannot delete a key a later attempt counts), but they are attempts
// of one acquisition: a key that an earlier attempt wrote, whose reply was
// lost and whose undo has not landed, is taken over by the next attempt at
// once instead of blocking the key until its TTL. Forced order: attempt 1's
// write is applied and its reply held (the client gives up), its undo is
// held, attempt 2 is applied, then the stale undo lands and must not touch
// attempt 2's key.
func TestLockTakesOverItsOwnEarlierAttemptsKey(t *testing.T) {
	ctx := t.Context()
	srv := redistest.Start(t, redistest.Config{})
	loadScripts(t, srv.Client())
	gate := redistest.NewGate(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: gate.Addr, ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.Ping(ctx).Err())
	const key = "attempts:takeover"
	l := singleLocker(t, c, redlease.WithTTL(20*time.Second), redlease.WithRetryDelay(time.Millisecond, time.Millisecond))

	acquireSHA, releaseSHA := script.Acquire.Hash(), script.Release.Hash()
	gate.HoldRequests(key)
	gate.HoldReplies(acquireSHA)
	probe := redistest.StartStallProbe(t)
	got := lockAsync(ctx, l, key) // its Lock is bounded at 30 s

	// Attempt 1 is applied; its reply is held, so the client times out and
	// sends its undo, which is held too.
	require.NoError(t, gate.WaitHeld(1, acquireSHA, 5*time.Second))
	require.NoError(t, gate.Step(acquireSHA, 5*time.Second))
	require.NoError(t, gate.WaitHeld(1, releaseSHA, 5*time.Second))
	first, err := srv.Client().Get(ctx, key).Result()
	require.NoError(t, err, "attempt 1 wrote the key")
	// Attempt 2 comes (the undo timed out in the client); its reply flows.
	// A reply that still misses the client's 200 ms read timeout (at load
	// 25-33 one did) costs one more attempt, which the gate holds too:
	// step each until one is answered in time, at most maxAttempts.
	gate.HoldReplies("")
	const maxAttempts = 20
	var r lockResult
	for attempt := 2; ; attempt++ {
		require.LessOrEqual(t, attempt, maxAttempts, "attempts whose replies missed the read timeout")
		require.NoError(t, gate.WaitHeld(1, acquireSHA, 5*time.Second))
		require.NoError(t, gate.Step(acquireSHA, 5*time.Second))
		answered := false
		probe.WaitFor(t, 5*time.Second, 3, time.Millisecond, func() bool {
			select {
			case r = <-got:
				answered = true
				return true
			default:
				return gate.HeldContaining(acquireSHA) > 0
			}
		}, "attempt %d neither returned nor was followed by another", attempt)
		if answered {
			t.Logf("attempt %d answered within the read timeout", attempt)
			break
		}
	}
	require.NoError(t, r.err, "the next attempt must take over its own earlier attempt's key, not wait for its TTL")
	require.NotEqual(t, first, r.lk.Token(), "attempts have tokens of their own")

	// The stale undo of attempt 1 lands: the last attempt's key stays.
	require.NoError(t, gate.Step(releaseSHA, 5*time.Second))
	gate.Open()
	held, err := srv.Client().Get(ctx, key).Result()
	require.NoError(t, err)
	require.Equal(t, r.lk.Token(), held, "a stale undo removed the new attempt's key")
	require.True(t, r.lk.Valid())
	locker := singleLocker(t, srv.Client())
	b, err := locker.TryLock(ctx, key)
	if err == nil {
		t.Fatalf("double grant: B got the lock (fence %d) while A holds it", b.Fence())
	}
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	require.NoError(t, r.lk.Release(ctx))
}
