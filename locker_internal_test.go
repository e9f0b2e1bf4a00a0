package redlease

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBackoffDoublesWithinJitterBounds(t *testing.T) {
	const lo, hi = 10 * time.Millisecond, 320 * time.Millisecond
	cases := []struct {
		attempt int
		want    time.Duration // the ceiling d; draws must lie in [d/2, d]
	}{
		{1, 10 * time.Millisecond},
		{2, 20 * time.Millisecond},
		{3, 40 * time.Millisecond},
		{6, 320 * time.Millisecond},
		{7, 320 * time.Millisecond},
		{1000, 320 * time.Millisecond},
	}
	for _, c := range cases {
		for range 200 {
			got := backoff(nil, c.attempt, lo, hi)
			if got < c.want/2 || got > c.want {
				t.Fatalf("backoff(%d) = %v, want within [%v, %v]", c.attempt, got, c.want/2, c.want)
			}
		}
	}
}

func TestBackoffIsBoundedByTheHoldersRemainingTTL(t *testing.T) {
	const lo, hi = 10 * time.Millisecond, 320 * time.Millisecond
	cases := []struct {
		name     string
		attempt  int
		refusal  error
		min, max time.Duration // the wait must lie in [min, max]
	}{
		{"no TTL known: plain backoff", 6, ErrNotObtained, 160 * time.Millisecond, 320 * time.Millisecond},
		{"holder expires sooner: 1 ms after it", 6, &HeldError{Remaining: 30 * time.Millisecond}, 31 * time.Millisecond, 31 * time.Millisecond},
		{"holder expires later: plain backoff", 6, &HeldError{Remaining: time.Hour}, 160 * time.Millisecond, 320 * time.Millisecond},
		{"about to expire: still 1 ms", 6, &HeldError{Remaining: 0}, time.Millisecond, time.Millisecond},
		{"quorum refusal carries it too", 6, &QuorumError{Err: ErrNotObtained, Remaining: 50 * time.Millisecond}, 51 * time.Millisecond, 51 * time.Millisecond},
		{"wrapped with ctx", 6, Wrap(&HeldError{Remaining: 20 * time.Millisecond}, context.Canceled), 21 * time.Millisecond, 21 * time.Millisecond},
	}
	for _, c := range cases {
		for range 100 {
			got := boundedBackoff(nil, c.attempt, lo, hi, c.refusal)
			if got < c.min || got > c.max {
				t.Fatalf("%s: got %v, want within [%v, %v]", c.name, got, c.min, c.max)
			}
		}
	}
}

// A Lock call granted the key leaves its subscription without a notice
// unread: one that came while its granted attempt was on its way (another
// node's push of the same release, on a quorum) announced a release that
// freed the key for this call, and nobody else can take the key until
// this call releases it, which wakes the next waiter. Left unread, the
// Waker hands it on, and the waiter it wakes is refused: measured in
// BenchmarkContentionOneKey as about one refused attempt per grant.
// A call that gives up still hands on what it owes or left unread.
func TestAGrantedWaiterHandsOnNoNotice(t *testing.T) {
	for _, tc := range []struct {
		name   string
		gaveUp bool
		owed   bool
		unread bool
		// wantUnread: a notice still in the channel when stop runs (the
		// Waker hands it on); wantHandOn: stop's argument.
		wantUnread, wantHandOn bool
	}{
		{name: "granted, a notice unread", unread: true},
		{name: "granted, owing", owed: true},
		{name: "gave up, a notice unread", gaveUp: true, unread: true, wantUnread: true, wantHandOn: true},
		{name: "gave up, owing", gaveUp: true, owed: true, wantHandOn: true},
		{name: "gave up, nothing owed", gaveUp: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			notices := make(chan struct{}, 1)
			if tc.unread {
				notices <- struct{}{}
			}
			var stopped, handOn, unread bool
			w := waiting{notices: notices, owed: tc.owed, stopWatch: func(h bool) {
				stopped, handOn, unread = true, h, len(notices) > 0
			}}
			w.end(tc.gaveUp)
			require.True(t, stopped)
			require.Equal(t, tc.wantUnread, unread, "a notice unread when stop ran")
			require.Equal(t, tc.wantHandOn, handOn, "stop's handOn")
		})
	}
}
