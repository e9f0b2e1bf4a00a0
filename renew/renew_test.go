package renew_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/renew"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memStrategy is an in-memory BatchExtender that counts its calls.
type memStrategy struct {
	mu      sync.Mutex
	held    map[string]string
	until   map[string]time.Time
	batches int
	extends int
}

func newMem() *memStrategy {
	return &memStrategy{held: map[string]string{}, until: map[string]time.Time{}}
}

func (m *memStrategy) Acquire(_ context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if t, ok := m.held[key]; ok && t != token && time.Now().Before(m.until[key]) {
		return redlease.Grant{}, redlease.ErrNotObtained
	}
	m.held[key], m.until[key] = token, time.Now().Add(ttl)
	return redlease.Grant{Until: m.until[key]}, nil
}

func (m *memStrategy) Extend(_ context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.extends++
	if m.held[key] != token || !time.Now().Before(m.until[key]) {
		return redlease.Grant{}, redlease.ErrNotHeld
	}
	m.until[key] = time.Now().Add(ttl)
	return redlease.Grant{Until: m.until[key]}, nil
}

func (m *memStrategy) Release(_ context.Context, key, token string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.held[key] != token {
		return redlease.ErrNotHeld
	}
	delete(m.held, key)
	return nil
}

func (m *memStrategy) ExtendBatch(ctx context.Context, items []redlease.Extension) []redlease.Extended {
	m.mu.Lock()
	m.batches++
	m.extends -= len(items) // counted as one batch, not as single extends
	m.mu.Unlock()
	out := make([]redlease.Extended, len(items))
	for i, it := range items {
		out[i].Grant, out[i].Err = m.Extend(ctx, it.Key, it.Token, it.TTL)
	}
	return out
}

func (m *memStrategy) counts() (batches, extends int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.batches, m.extends
}

func TestKeepsManyLocksWithFewBatches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMem()
		w, err := renew.New()
		require.NoError(t, err)
		defer w.Stop()
		l := redlease.New(m, redlease.WithTTL(3*time.Second))
		var locks []*redlease.Lock
		for i := range 1000 {
			lk, err := l.TryLock(t.Context(), "k"+string(rune(i)))
			require.NoError(t, err)
			w.Keep(lk)
			locks = append(locks, lk)
			if i%100 == 99 {
				time.Sleep(50 * time.Millisecond) // taken at scattered moments
			}
		}
		time.Sleep(10 * time.Second)
		for i, lk := range locks {
			require.True(t, lk.Valid(), "lock %d lost", i)
		}
		batches, extends := m.counts()
		assert.Zero(t, extends, "no lock is extended on its own")
		// 10 s at one extension per second: a batch-per-lock design would
		// need ten thousand calls; grouping needs a few per second.
		assert.Less(t, batches, 40, "batches in 10 s for 1000 locks")
		t.Logf("1000 locks kept 10 s with %d batch calls", batches)
	})
}

func TestLockNotHeldIsLostBeforeUntil(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMem()
		w, err := renew.New()
		require.NoError(t, err)
		defer w.Stop()
		lk, err := redlease.New(m, redlease.WithTTL(3*time.Second)).TryLock(t.Context(), "k")
		require.NoError(t, err)
		w.Keep(lk)
		m.mu.Lock()
		m.held["k"] = "someone else" // taken over behind our back
		m.mu.Unlock()
		<-lk.Lost()
		assert.True(t, time.Now().Before(lk.Until()), "Lost must close before Until")
		assert.ErrorIs(t, lk.Err(), redlease.ErrNotHeld)
		synctest.Wait()
		assert.Zero(t, w.Len(), "a lost lock is no longer kept")
	})
}

func TestReleaseAndStopEndRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMem()
		w, err := renew.New()
		require.NoError(t, err)
		l := redlease.New(m, redlease.WithTTL(3*time.Second))
		a, err := l.TryLock(t.Context(), "a")
		require.NoError(t, err)
		b, err := l.TryLock(t.Context(), "b")
		require.NoError(t, err)
		w.Keep(a)
		stopB := w.Keep(b)
		assert.Equal(t, 2, w.Len())

		require.NoError(t, a.Release(t.Context()))
		stopB()
		stopB() // harmless twice
		time.Sleep(5 * time.Second)
		assert.Zero(t, w.Len())
		batches, _ := m.counts()
		assert.LessOrEqual(t, batches, 1, "released and stopped locks are not extended (one batch may find a released lock)")
		assert.False(t, b.Valid(), "b expired once no longer kept")
		w.Stop()
		w.Stop() // harmless twice
		assert.NotPanics(t, func() { w.Keep(b)() })
	})
}

func TestRejectsBadOptions(t *testing.T) {
	for _, o := range []renew.Option{renew.WithFraction(0), renew.WithFraction(1), renew.WithWorkers(0)} {
		_, err := renew.New(o)
		assert.ErrorIs(t, err, redlease.ErrInvalid)
	}
}
