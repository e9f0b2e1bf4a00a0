package renewal_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/redlease/redlease/internal/renewal"
)

// varItem is an item whose TTL can change (as a Lock's does with Extend)
// and whose loss margin is its own.
type varItem struct {
	mu      sync.Mutex
	ttl     time.Duration
	margin  time.Duration
	until   time.Time
	renewed int
}

func (i *varItem) TTL() time.Duration {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.ttl
}
func (i *varItem) Until() time.Time {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.until
}
func (i *varItem) Deadline() time.Time {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.until.Add(-i.margin)
}
func (i *varItem) Valid() bool { return time.Now().Before(i.Deadline()) }

// renewals returns how many times the engine renewed it.
func (i *varItem) renewals() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.renewed
}

// extend sets the TTL to ttl and extends by it, as Lock.Extend does.
func (i *varItem) extend(ttl time.Duration) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.ttl, i.until = ttl, time.Now().Add(ttl)
}

func extendVar(_ context.Context, items []*varItem) []error {
	for _, it := range items {
		it.mu.Lock()
		it.until = time.Now().Add(it.ttl)
		it.renewed++
		it.mu.Unlock()
	}
	return make([]error, len(items))
}

func varEngine() *renewal.Engine[*varItem] {
	return renewal.New(renewal.Config[*varItem]{
		Extend:   extendVar,
		NotHeld:  func(err error) bool { return errors.Is(err, errNotHeld) },
		Lane:     func(*varItem) any { return "one" },
		IdleStop: true,
	})
}

// keptValid steps through d in steps of step and fails at the first
// moment it is no longer Valid; it returns how many moments it found it
// valid.
func keptValid(t *testing.T, it *varItem, d, step time.Duration) int {
	t.Helper()
	n := 0
	for end := time.Now().Add(d); time.Now().Before(end); n++ {
		time.Sleep(step)
		if !it.Valid() {
			t.Errorf("lost after %d steps of %v: TTL %v, %d renewals", n+1, step, it.TTL(), it.renewals())
			break
		}
	}
	return n
}

// The renewal interval follows the item's TTL: kept at 9 s (due every
// 3 s), then extended to 1.5 s by its holder (who tells the engines with
// Touch, as Lock.Extend does), it is renewed every half second from then
// on, and stays valid. With the interval fixed at Keep, it was lost 0.6 s
// after the extension (its deadline, 0.9 s before Until), its first
// renewal being due 2 s later.
func TestIntervalFollowsTheTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := varEngine()
		it := &varItem{ttl: 9 * time.Second, margin: 900 * time.Millisecond, until: time.Now().Add(9 * time.Second)}
		stop := w.Keep(it)
		time.Sleep(time.Second)
		it.extend(1500 * time.Millisecond)
		renewal.Touch(it)
		assert.Equal(t, 100, keptValid(t, it, 10*time.Second, 100*time.Millisecond))
		assert.GreaterOrEqual(t, it.renewals(), 10, "renewed every fraction of the new TTL")
		stop()
		synctest.Wait()
	})
}

// An item whose Deadline is nearer than its TTL suggests (a loss margin
// that takes most of the TTL, as after an Extend to a TTL not much longer
// than the margin) is renewed before it: the first renewal is due no
// later than half the time to the Deadline, and so is every next one.
func TestIntervalFitsBeforeTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := varEngine()
		// TTL 4 s, margin 3 s: every renewal leaves 1 s to the deadline, and
		// a third of the TTL is 1.33 s.
		it := &varItem{ttl: 4 * time.Second, margin: 3 * time.Second, until: time.Now().Add(4 * time.Second)}
		stop := w.Keep(it)
		assert.Equal(t, 50, keptValid(t, it, 10*time.Second, 200*time.Millisecond))
		stop()
		synctest.Wait()
	})
}
