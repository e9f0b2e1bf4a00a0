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
	return m.extendLocked(key, token, ttl)
}

// extendLocked extends key for token, uncounted; m.mu is held.
func (m *memStrategy) extendLocked(key, token string, ttl time.Duration) (redlease.Grant, error) {
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

// ExtendBatch extends every item and counts one batch, in one critical
// section: a count read while a batch runs (the watchdog's goroutine may
// run at the very instant a test's sleep ends) sees it whole or not at
// all. (It used to count the batch's items as single extends and take
// them back first, so a read in between saw a negative count: 8 of 300
// runs of TestKeepsManyLocksWithFewBatches failed so beside yes ×2.)
func (m *memStrategy) ExtendBatch(_ context.Context, items []redlease.Extension) []redlease.Extended {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.batches++
	out := make([]redlease.Extended, len(items))
	for i, it := range items {
		out[i].Grant, out[i].Err = m.extendLocked(it.Key, it.Token, it.TTL)
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
		defer w.Close()
		l, err := redlease.New(m, redlease.WithTTL(3*time.Second))
		require.NoError(t, err)
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
		defer w.Close()
		locker, err := redlease.New(m, redlease.WithTTL(3*time.Second))
		require.NoError(t, err)
		lk, err := locker.TryLock(t.Context(), "k")
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

func TestReleaseAndCloseEndRenewal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := newMem()
		w, err := renew.New()
		require.NoError(t, err)
		l, err := redlease.New(m, redlease.WithTTL(3*time.Second))
		require.NoError(t, err)
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
		w.Close()
		w.Close() // harmless twice
		assert.NotPanics(t, func() { w.Keep(b)() })
	})
}

func TestRejectsBadOptions(t *testing.T) {
	for _, o := range []renew.Option{renew.WithFraction(0), renew.WithFraction(1), renew.WithMaxCalls(0)} {
		_, err := renew.New(o)
		assert.ErrorIs(t, err, redlease.ErrInvalid)
	}
}

// rateClock runs at rate times real time from start.
type rateClock struct {
	start time.Time
	rate  float64
}

func (c rateClock) Now() time.Time {
	return c.start.Add(time.Duration(c.rate * float64(time.Since(c.start))))
}

// clockStrategy keeps locks in m, and its grants run until ttl after c's
// reading, as the strategies given the same WithClock judge them; m's own
// expiry (real time) is kept out of the way. It does not batch.
type clockStrategy struct {
	m *memStrategy
	c redlease.Clock
}

func (s clockStrategy) Acquire(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	if _, err := s.m.Acquire(ctx, key, token, time.Hour); err != nil {
		return redlease.Grant{}, err
	}
	return redlease.Grant{Until: s.c.Now().Add(ttl)}, nil
}

func (s clockStrategy) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	if _, err := s.m.Extend(ctx, key, token, time.Hour); err != nil {
		return redlease.Grant{}, err
	}
	return redlease.Grant{Until: s.c.Now().Add(ttl)}, nil
}

func (s clockStrategy) Release(ctx context.Context, key, token string) error {
	return s.m.Release(ctx, key, token)
}

// A Watchdog schedules by its clock. The Locker's clock here runs at a
// quarter of real time, so a 3 s lock wants an extension every 4 s of real
// time (taken a quarter of that early: every 3 s): a Watchdog on the same
// clock extends it about 5 times in 16 s. One on the system clock compares
// the lock's Deadline, which falls ever further behind real time, with
// real time: the lock seems ever closer to being lost, so after the first
// few renewals (every 0.75 s) it is renewed as often as the Watchdog ever
// renews anything, every quarter interval (0.25 s): about 55 times.
func TestWatchdogSchedulesByItsClock(t *testing.T) {
	for _, tc := range []struct {
		name     string
		clock    bool
		min, max int
	}{{"locker's clock", true, 4, 6}, {"system clock", false, 40, 70}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := rateClock{start: time.Now(), rate: 0.25}
				var opts []renew.Option
				if tc.clock {
					opts = append(opts, renew.WithClock(c))
				}
				w, err := renew.New(opts...)
				require.NoError(t, err)
				defer w.Close()
				s := clockStrategy{newMem(), c}
				locker, err := redlease.New(s, redlease.WithTTL(3*time.Second), redlease.WithClock(c))
				require.NoError(t, err)
				lk, err := locker.TryLock(t.Context(), "k")
				require.NoError(t, err)
				w.Keep(lk)
				time.Sleep(16 * time.Second)
				require.True(t, lk.Valid())
				_, extends := s.m.counts()
				assert.GreaterOrEqual(t, extends, tc.min, "extensions in 16 s")
				assert.LessOrEqual(t, extends, tc.max, "extensions in 16 s")
				require.NoError(t, lk.Release(t.Context()))
			})
		})
	}
}

func TestRejectsNilClock(t *testing.T) {
	_, err := renew.New(renew.WithClock(nil))
	assert.ErrorIs(t, err, redlease.ErrInvalid)
}
