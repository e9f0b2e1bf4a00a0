package redlease_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
)

// queuedFake is a Queuer and Waker whose AcquireInLine answers from a
// script, one answer per attempt (the last one repeats), and records when
// each attempt came. No notice is ever sent: every one is lost.
type queuedFake struct {
	*wakerFake
	mu      sync.Mutex
	answers []error // nil: granted
	at      []time.Time
}

func (q *queuedFake) AcquireInLine(ctx context.Context, key, token string, ttl time.Duration, place redlease.Place) (redlease.Grant, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.at = append(q.at, time.Now())
	err := q.answers[0]
	if len(q.answers) > 1 {
		q.answers = q.answers[1:]
	}
	if err != nil {
		return redlease.Grant{}, err
	}
	return redlease.Grant{Until: time.Now().Add(ttl), Fence: 1}, nil
}

func (q *queuedFake) LeaveLine(ctx context.Context, key, id string) error { return nil }

// A fair waiter refused with ErrQueued (the key was free, another waiter
// was the line's head) has no holder's TTL to bound its wait by. The head
// takes the key within a round trip or two, or is gone: waiting the max
// retry delay (as a refusal by a holder whose notice will come does)
// would leave the waiter asleep past the head's whole hold when the
// release's notice is lost. Found by the simulator's fair-single
// (seed 1994: a Queued waiter, its notices lost, granted 536 ms after
// the holder's release, past its 280 ms TTL). After ErrQueued the wait
// ramps from the min delay instead; the next refusal, by the head now
// holding the key, carries its TTL and bounds the wait by it.
func TestAQueuedWaiterIsBoundByTheHeadsHoldNotByTheMaxDelay(t *testing.T) {
	queued := redlease.Wrap(redlease.ErrNotObtained, redlease.ErrQueued)
	synctest.Test(t, func(t *testing.T) {
		q := &queuedFake{wakerFake: newWakerFake(), answers: []error{
			queued, // the first check
			queued, // the check after subscribing: the head has not taken the key yet
			&redlease.HeldError{Remaining: 100 * time.Millisecond}, // the head holds it now
			nil, // the head's release, its notice lost: the key is free
		}}
		l, err := redlease.New(q, redlease.WithFairness(true), redlease.WithRetryDelay(10*time.Millisecond, time.Second))
		require.NoError(t, err)
		start := time.Now()
		lk, err := l.Lock(t.Context(), "k")
		require.NoError(t, err)
		require.NotNil(t, lk)
		q.mu.Lock()
		defer q.mu.Unlock()
		require.Len(t, q.at, 4)
		took := time.Since(start)
		// The ramp's first wait (at most the min delay), then the head's
		// TTL plus 1 ms: not the max delay's 0.5–1 s.
		require.LessOrEqual(t, took, 10*time.Millisecond+101*time.Millisecond,
			"granted %v after the call; attempts at %v", took, offsets(start, q.at))
	})
}

// A head that never comes (it died in line; its entry lives until its
// lifetime ends) costs the Queued waiter a ramp of attempts, not a poll
// at the min delay: at most a few more than the ramp's doublings up to
// the max delay, within one max delay's time.
func TestAQueuedWaiterRampsUpItsAttempts(t *testing.T) {
	queued := redlease.Wrap(redlease.ErrNotObtained, redlease.ErrQueued)
	synctest.Test(t, func(t *testing.T) {
		q := &queuedFake{wakerFake: newWakerFake(), answers: []error{queued}}
		l, err := redlease.New(q, redlease.WithFairness(true), redlease.WithRetryDelay(10*time.Millisecond, 640*time.Millisecond))
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		_, err = l.Lock(ctx, "k")
		require.ErrorIs(t, err, redlease.ErrQueued)
		q.mu.Lock()
		defer q.mu.Unlock()
		// Waits drawn from [d/2, d], d = 10, 20, …, 640 ms, then 640 ms:
		// 3 s hold at most 2 checks, 7 ramp steps and 3 s / 320 ms more
		// (a poll at the min delay would make about 300).
		require.LessOrEqual(t, len(q.at), 2+7+10, "attempts at %v", offsets(time.Time{}, q.at))
	})
}

// offsets returns ts as durations since start (since ts[0] if start is
// zero).
func offsets(start time.Time, ts []time.Time) []time.Duration {
	if start.IsZero() && len(ts) > 0 {
		start = ts[0]
	}
	out := make([]time.Duration, len(ts))
	for i, t := range ts {
		out[i] = t.Sub(start)
	}
	return out
}
