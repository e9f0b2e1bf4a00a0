package failover

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A poll's questions time out before the next poll is due, so that a
// Sentinel that did not answer is free to be asked again by then, and a
// question's end and the next tick never fall on one instant.
func TestAskTimeoutEndsBeforeTheNextPoll(t *testing.T) {
	checked := 0
	for _, interval := range []time.Duration{4, 5, 100 * time.Millisecond, DefaultPollInterval, 999 * time.Millisecond,
		time.Second, 4 * time.Second / 3, 2 * time.Second, time.Hour} {
		got := askTimeout(interval)
		assert.Less(t, got, interval, "interval %v", interval)
		assert.GreaterOrEqual(t, got, min(interval*3/4, maxAskTimeout), "interval %v", interval)
		assert.LessOrEqual(t, got, maxAskTimeout, "interval %v", interval)
		checked++
	}
	for _, interval := range []time.Duration{1, 2, 3} {
		assert.Equal(t, interval, askTimeout(interval), "a timeout below 4 ns is the interval, never 0")
		checked++
	}
	assert.Equal(t, 12, checked)
}

// A tick and a +switch-master pending together start one poll, not one and
// then another at once: before, next's select picked one of the two at
// random and left the other pending (chaos/sim failover 48: c0's Watcher
// polled once more at 992 ms in half the replays). Forced order: both are
// pending before next is called; after it, neither is. A closing Watcher
// starts no poll, whatever is pending.
func TestOnePollServesATickAndASwitchTogether(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	w := &Watcher{ctx: ctx, askNow: make(chan struct{}, 1)}
	tick := make(chan time.Time, 1)
	for try := range 20 {
		bothPending(w, tick)
		require.True(t, w.next(tick), "try %d", try)
		assert.Empty(t, tick, "try %d: a tick left pending starts a second poll at once", try)
		assert.Empty(t, w.askNow, "try %d: a +switch-master left pending starts a second poll at once", try)
	}
	bothPending(w, tick)
	cancel()
	for try := range 20 {
		require.False(t, w.next(tick), "try %d: a closing Watcher polled", try)
	}
}

// bothPending leaves a tick and a +switch-master pending for w.next (one
// left from before counts).
func bothPending(w *Watcher, tick chan time.Time) {
	select {
	case tick <- time.Now():
	default:
	}
	select {
	case w.askNow <- struct{}{}:
	default:
	}
}
