package renewal

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

type touchItem struct{ until time.Time }

func (i *touchItem) Valid() bool         { return time.Now().Before(i.until) }
func (i *touchItem) TTL() time.Duration  { return 3 * time.Second }
func (i *touchItem) Until() time.Time    { return i.until }
func (i *touchItem) Deadline() time.Time { return i.until }

func touchEngine() *Engine[*touchItem] {
	return New(Config[*touchItem]{
		Extend:   func(_ context.Context, items []*touchItem) []error { return make([]error, len(items)) },
		NotHeld:  func(error) bool { return false },
		Lane:     func(*touchItem) any { return "one" },
		IdleStop: true,
	})
}

// An item is registered for Touch while an engine keeps it, once per
// engine, and no longer once stopped or the engine closed: the registry
// holds nothing for items nobody keeps.
func TestTouchRegistrationEndsWithTheKeeping(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		it := &touchItem{until: time.Now().Add(3 * time.Second)}
		a, b := touchEngine(), touchEngine()
		stopA := a.Keep(it)
		stopB := b.Keep(it)
		assert.Len(t, touches.of(it), 2)
		stopA()
		assert.Len(t, touches.of(it), 1)
		b.Close()
		assert.Empty(t, touches.of(it))
		stopB()
		touches.mu.Lock()
		assert.Empty(t, touches.m)
		touches.mu.Unlock()
		synctest.Wait()
	})
}
