package redlease_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
)

// slowObserver takes its time to record how a hold ended, as an exporter
// blocked on a full queue or a slow log sink would: until release closes.
type slowObserver struct {
	release chan struct{}
	done    chan struct{}
}

func (o slowObserver) Start(ctx context.Context, _ redlease.Op) (context.Context, func(error)) {
	return ctx, func(error) {}
}
func (o slowObserver) Held(redlease.Op, time.Duration, error) {
	<-o.release
	close(o.done)
}
func (o slowObserver) NodeFailed(context.Context, redlease.Op, *redlease.NodeError) {}

// A slow Observer costs metrics, never the loss notice: Lost closes a loss
// margin before Until however long Observer.Held takes, and Valid does not
// wait for it either.
func TestSlowObserverDoesNotDelayTheLossNotice(t *testing.T) {
	// In a bubble (virtual time): the fake strategy is in process, and a
	// machine starved of CPU must not decide whether the timer ran in time
	// (Lost's doc: a starved process sees it late).
	synctest.Test(t, func(t *testing.T) {
		const ttl = 300 * time.Millisecond
		o := slowObserver{release: make(chan struct{}), done: make(chan struct{})}
		t.Cleanup(func() {
			close(o.release)
			<-o.done
		})
		l, err := redlease.New(newFake(), redlease.WithTTL(ttl), redlease.WithObserver(o))
		require.NoError(t, err)
		lk, err := l.TryLock(t.Context(), "k")
		if !assert.NoError(t, err) {
			return
		}
		until := lk.Until()
		select {
		case <-lk.Lost():
			assert.False(t, time.Now().After(until), "Lost closed %v after Until", time.Since(until))
		case <-time.After(3 * ttl):
			t.Fatalf("Lost not closed within 3×TTL (Until was %v ago)", time.Since(until))
		}
		start := time.Now()
		assert.False(t, lk.Valid())
		assert.Less(t, time.Since(start), 100*time.Millisecond, "Valid waited for the Observer")
	})
}
