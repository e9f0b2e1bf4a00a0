package renew_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/renew"
	"github.com/redlease/redlease/single"
)

// takeSingle takes key on the single strategy over c for ttl.
func takeSingle(t *testing.T, c redis.UniversalClient, key string, ttl time.Duration) *redlease.Lock {
	t.Helper()
	s, err := single.New(c)
	require.NoError(t, err)
	l, err := redlease.New(s, redlease.WithTTL(ttl))
	require.NoError(t, err)
	lk, err := l.TryLock(t.Context(), key)
	require.NoError(t, err)
	return lk
}

// A kept lock whose extensions fail at once with an error that says
// nothing about the lock (NOPERM here: the client's user lost its key
// permissions; READONLY, LOADING and BUSY take the same path) is retried
// every min(interval/4, 250 ms), not in a loop: the node sees a handful of
// calls, and the lock is reported lost before its Until.
func TestFailedRenewalsWaitForTheirRetryTime(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second // interval 1 s, retry every 250 ms
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	c := srv.Client()
	w, err := renew.New()
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })

	lk := takeSingle(t, c, "retry:noperm", ttl)
	taken := time.Now()
	before := evalshaAttempts(t, c)
	w.Keep(lk)
	// Every script call on a key now fails with NOPERM, before it runs.
	require.NoError(t, c.Do(context.Background(), "ACL", "SETUSER", "default", "resetkeys").Err())

	lostAt, lost := waitLost(t, probe, lk, taken)
	require.True(t, lost, "the lock is reported lost")
	assertLostBeforeUntil(t, probe, lk, lostAt)
	assert.ErrorIs(t, lk.Err(), redlease.ErrLost)
	calls := evalshaAttempts(t, c) - before
	// First renewal one interval after the grant, then retries every 250 ms
	// until Until minus the margin (0.9 ttl): 1 + (0.9−1/3)·3 s / 250 ms ≈ 8.
	// The upper bound is the retry delay's (a stall only delays calls). The
	// lower one needs the process to run: of the 1.7 s from the first
	// renewal to the deadline, a stall of stallMultiple times S leaves
	// (1.7 s − 2S)/250 ms retries; at least 3 calls are asked for while
	// that leaves room for them, at least the first one always.
	first, deadline := taken.Add(ttl/3), lk.Deadline()
	stalled := probe.Stalled(first, deadline)
	room := deadline.Sub(first) - time.Duration(stallMultiple)*stalled
	least := max(1, min(3, 1+int(room/(250*time.Millisecond))))
	t.Logf("%d script calls between the grant and the loss %v later", calls, lostAt.Sub(taken).Round(time.Millisecond))
	assert.LessOrEqual(t, calls, 10, "failed renewals must wait for their retry time")
	assert.GreaterOrEqual(t, calls, least, "failed renewals are retried while the lock is valid: at least %d calls asked of %v from the first renewal to the deadline, less %d × %v this process was measured stalled in it",
		least, deadline.Sub(first).Round(time.Millisecond), stallMultiple, stalled.Round(time.Millisecond))
}

// A kept lock whose key was overwritten with a value of another type (a
// hash: GET answers WRONGTYPE) is not held, as surely as one whose key
// holds another token: the first renewal reports it lost, naming the
// cause, and nothing is retried.
func TestRenewalOfAKeyOfAnotherTypeIsAVerdict(t *testing.T) {
	t.Parallel()
	const ttl = 3 * time.Second // interval 1 s
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	c := srv.Client()
	w, err := renew.New()
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })

	lk := takeSingle(t, c, "retry:wrongtype", ttl)
	taken := time.Now()
	before := evalshaCalls(t, c)
	w.Keep(lk)
	ctx := context.Background()
	require.NoError(t, c.Del(ctx, "retry:wrongtype").Err())
	require.NoError(t, c.HSet(ctx, "retry:wrongtype", "not", "a lock").Err())

	_, lost := waitLost(t, probe, lk, taken)
	require.True(t, lost, "the lock is reported lost")
	assert.ErrorIs(t, lk.Err(), redlease.ErrLost)
	assert.ErrorIs(t, lk.Err(), redlease.ErrNotHeld)
	assert.Contains(t, lk.Err().Error(), "WRONGTYPE")
	time.Sleep(600 * time.Millisecond) // more than two retry delays
	assert.Equal(t, 1, evalshaCalls(t, c)-before, "one renewal, then nothing")
}

// failing is a BatchExtender whose every extension fails at once with an
// error that says nothing about the lock (the shape of WRONGTYPE or
// READONLY), counting its calls.
type failing struct {
	*memStrategy
	mu    sync.Mutex
	calls []time.Time
}

var errFast = errors.New("READONLY You can't write against a read only replica")

func (f *failing) ExtendBatch(_ context.Context, items []redlease.Extension) []redlease.Extended {
	f.mu.Lock()
	f.calls = append(f.calls, time.Now())
	storm := len(f.calls) > 100
	f.mu.Unlock()
	out := make([]redlease.Extended, len(items))
	for i := range out {
		out[i].Err = errors.Join(redlease.ErrUnavailable, errFast)
		if storm {
			// In a bubble, a retry loop that never waits would never let
			// time pass: end it so the test can report it.
			out[i].Err = redlease.ErrNotHeld
		}
	}
	return out
}

// The same on a fake strategy in a bubble, to the millisecond: no two calls
// closer than the retry delay, and the first one a full interval after the
// grant.
func TestRetryScheduleOfAFastFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ttl = 3 * time.Second
		f := &failing{memStrategy: newMem()}
		w, err := renew.New()
		require.NoError(t, err)
		defer w.Close()
		locker, err := redlease.New(f, redlease.WithTTL(ttl))
		require.NoError(t, err)
		lk, err := locker.TryLock(t.Context(), "k")
		require.NoError(t, err)
		taken := time.Now()
		w.Keep(lk)
		<-lk.Lost()
		synctest.Wait()
		f.mu.Lock()
		calls := f.calls
		f.mu.Unlock()
		require.NotEmpty(t, calls)
		assert.GreaterOrEqual(t, calls[0].Sub(taken), ttl/3-ttl/12, "first renewal about one interval after the grant")
		early, minGap := 0, time.Duration(1<<62)
		for i := 1; i < len(calls); i++ {
			gap := calls[i].Sub(calls[i-1])
			minGap = min(minGap, gap)
			if gap < 250*time.Millisecond {
				early++
			}
		}
		assert.Zero(t, early, "%d of %d calls came sooner than 250 ms after the one before (closest: %v)", early, len(calls), minGap)
		assert.LessOrEqual(t, len(calls), 10)
		assert.ErrorIs(t, lk.Err(), redlease.ErrLost)
	})
}

// evalshaAttempts counts the EVALSHA commands c's node received: run,
// rejected before running (NOPERM, READONLY, ...) or failed while running.
func evalshaAttempts(t *testing.T, c redis.UniversalClient) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:")
		if !ok {
			continue
		}
		n := 0
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			if k == "calls" || k == "rejected_calls" || k == "failed_calls" {
				x, err := strconv.Atoi(v)
				require.NoError(t, err, "commandstats field %q", f)
				n += x
			}
		}
		return n
	}
	return 0
}
