package redlease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
)

// TestSemaphoreRejectsBadInput: an empty name, N below 1 or above
// MaxPermits, a nil Locker, a nil fn: ErrInvalid, and nothing taken.
func TestSemaphoreRejectsBadInput(t *testing.T) {
	f := newFake()
	l := newLocker(t, f)
	for _, c := range []struct {
		name string
		n    int
	}{{"", 3}, {"s", 0}, {"s", -1}, {"s", redlease.MaxPermits + 1}} {
		sem, err := l.Semaphore(c.name, c.n)
		assert.ErrorIs(t, err, redlease.ErrInvalid, "%q, %d", c.name, c.n)
		assert.Nil(t, sem)
	}
	_, err := (*redlease.Locker)(nil).Semaphore("s", 1)
	assert.ErrorIs(t, err, redlease.ErrInvalid, "nil Locker")
	_, err = (*redlease.Semaphore)(nil).TryAcquire(t.Context())
	assert.ErrorIs(t, err, redlease.ErrInvalid, "nil Semaphore")
	sem, err := l.Semaphore("s", redlease.MaxPermits)
	require.NoError(t, err)
	assert.Equal(t, "s#0", sem.Slots()[0])
	assert.Equal(t, fmt.Sprintf("s#%d", redlease.MaxPermits-1), sem.Slots()[redlease.MaxPermits-1])
	assert.ErrorIs(t, sem.Do(t.Context(), nil), redlease.ErrInvalid, "nil fn")
	_, err = sem.TryAcquire(t.Context(), redlease.WithTTL(-time.Second))
	assert.ErrorIs(t, err, redlease.ErrInvalid, "a bad option")
	assert.Empty(t, f.held, "nothing taken")
}

// TestSemaphoreOutageIsNotAllHeld: a round in which one slot was refused
// and another undecided is ErrUnavailable, never ErrNotObtained; one in
// which every slot was refused is ErrNotObtained, with each slot's error.
func TestSemaphoreOutageIsNotAllHeld(t *testing.T) {
	f := newFake()
	l := newLocker(t, f)
	sem, err := l.Semaphore("s", 2)
	require.NoError(t, err)
	a, err := sem.TryAcquire(t.Context())
	require.NoError(t, err)
	b, err := sem.TryAcquire(t.Context())
	require.NoError(t, err)
	assert.NotEqual(t, a.Key(), b.Key(), "two permits, two slots")
	f.mu.Lock()
	f.failNext = []error{redlease.ErrUnavailable}
	f.mu.Unlock()
	_, err = sem.TryAcquire(t.Context())
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	require.NotErrorIs(t, err, redlease.ErrNotObtained, "an undecided slot is no holder: %v", err)
	_, err = sem.TryAcquire(t.Context())
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	require.NotErrorIs(t, err, redlease.ErrUnavailable)
	var pe *redlease.PermitError
	require.ErrorAs(t, err, &pe)
	assert.Len(t, pe.Slots, 2)
	for i, e := range pe.Slots {
		assert.ErrorIs(t, e, redlease.ErrNotObtained, "slot %d", i)
	}
	assert.Contains(t, err.Error(), `semaphore "s": 2 of 2 slots held`)
}

// TestSemaphoreAcquireReturnsByItsDeadline: every slot held, Acquire
// waits until its ctx's deadline and returns ErrNotObtained with it.
func TestSemaphoreAcquireReturnsByItsDeadline(t *testing.T) {
	f := newFake()
	l := newLocker(t, f, redlease.WithRetryDelay(time.Millisecond, 5*time.Millisecond))
	sem, err := l.Semaphore("s", 2)
	require.NoError(t, err)
	for range 2 {
		_, err := sem.TryAcquire(t.Context())
		require.NoError(t, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err = sem.Acquire(ctx)
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
