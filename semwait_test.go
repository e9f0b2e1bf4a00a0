package redlease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/single"
)

// TestSemaphoreAcquireWakesOnRelease: both permits of N = 2 held for a
// minute; an Acquire whose backoff is an hour (so that only a wake can
// end its wait before the holders' TTL) waits, subscribed to both slots.
// Forced order: the release comes only once the node lists the waiter's
// subscriptions. The waiter is granted the released slot within the
// test's 30 s, not at the holders' expiry a minute on.
func TestSemaphoreAcquireWakesOnRelease(t *testing.T) {
	c := redistest.Start(t, redistest.Config{}).Client()
	ctx := t.Context()
	l := singleLocker(t, c, redlease.WithTTL(time.Minute), redlease.WithRetryDelay(time.Hour, time.Hour))
	sem, err := l.Semaphore("wake", 2)
	require.NoError(t, err)
	held := takePermits(t, sem, 2)

	type result struct {
		lk  *redlease.Lock
		err error
	}
	done := make(chan result, 1)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() {
		lk, err := sem.Acquire(wctx)
		done <- result{lk, err}
	}()
	channels := []string{script.Channel(sem.Slots()[0]), script.Channel(sem.Slots()[1])}
	require.Eventually(t, func() bool {
		n, err := c.PubSubNumSub(ctx, channels...).Result()
		return err == nil && n[channels[0]] > 0 && n[channels[1]] > 0
	}, 10*time.Second, time.Millisecond, "the waiter subscribes to both slots")
	require.NoError(t, held[1].Release(ctx))
	r := <-done
	require.NoError(t, r.err, "woken by the release, not at the holders' TTL")
	assert.Equal(t, held[1].Key(), r.lk.Key(), "the released slot")
	require.NoError(t, r.lk.Release(ctx))
	require.NoError(t, held[0].Release(ctx))
}

// gatedWatch is a single strategy whose first Watch runs before first,
// once, before it subscribes: a release that lands between a waiter's
// refused round and its subscription.
type gatedWatch struct {
	*single.Strategy
	once  sync.Once
	first func()
}

func (g *gatedWatch) Watch(ctx context.Context, key, waiter string) (<-chan struct{}, func(bool), error) {
	g.once.Do(g.first)
	return g.Strategy.Watch(ctx, key, waiter)
}

// TestSemaphoreAcquireHearsAReleaseBeforeItsSubscription: forced order,
// a permit released after the waiter's first round was refused and
// before its subscriptions (in the strategy's Watch, before it
// subscribes): no notice will come for it, and the waiter's backoff is
// an hour. The round Acquire makes right after subscribing finds the
// slot free, within the test's 30 s, not at the other holder's expiry a
// minute on.
func TestSemaphoreAcquireHearsAReleaseBeforeItsSubscription(t *testing.T) {
	c := redistest.Start(t, redistest.Config{}).Client()
	ctx := t.Context()
	holders := singleLocker(t, c, redlease.WithTTL(time.Minute))
	hsem, err := holders.Semaphore("gate", 2)
	require.NoError(t, err)
	held := takePermits(t, hsem, 2)
	s, err := single.New(c)
	require.NoError(t, err)
	g := &gatedWatch{Strategy: s, first: func() { assert.NoError(t, held[0].Release(ctx)) }} // on Watch's goroutine: no FailNow
	l := newLocker(t, g, redlease.WithTTL(time.Minute), redlease.WithRetryDelay(time.Hour, time.Hour))
	sem, err := l.Semaphore("gate", 2)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lk, err := sem.Acquire(wctx)
	require.NoError(t, err, "the round after subscribing finds the slot released before it")
	assert.Equal(t, held[0].Key(), lk.Key())
	require.NoError(t, lk.Release(ctx))
	require.NoError(t, held[1].Release(ctx))
}

// takePermits takes n permits of sem with TryAcquire; a refusal fails t.
func takePermits(t *testing.T, sem *redlease.Semaphore, n int) []*redlease.Lock {
	t.Helper()
	held := make([]*redlease.Lock, n)
	for i := range held {
		lk, err := sem.TryAcquire(t.Context())
		require.NoError(t, err)
		held[i] = lk
	}
	return held
}
