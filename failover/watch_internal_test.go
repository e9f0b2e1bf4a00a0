package failover

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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
