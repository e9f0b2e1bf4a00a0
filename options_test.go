package redlease_test

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
)

func TestPerCallStrategyAndPrefix(t *testing.T) {
	cheap, careful := newFake(), newFake()
	l, err := redlease.New(cheap, redlease.WithPrefix("app:"))
	require.NoError(t, err)
	_, err = l.TryLock(t.Context(), "a")
	require.NoError(t, err)
	_, err = l.TryLock(t.Context(), "b", redlease.WithStrategy(careful))
	require.NoError(t, err)
	assert.Equal(t, []string{"app:a"}, cheap.keys)
	assert.Equal(t, []string{"app:b"}, careful.keys)
}

// fastClock runs at twice real time.
type fastClock struct{ start time.Time }

func (c fastClock) Now() time.Time { return c.start.Add(2 * time.Since(c.start)) }

// A lock judges its validity by its Locker's clock: with a clock running
// at twice real speed it counts as lost after half the real time.
func TestLocksFollowTheInjectedClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := fastClock{start: time.Now()}
		f, _, lk := fakeLock(t, redlease.WithTTL(time.Second), redlease.WithLossMargin(0), redlease.WithClock(clock))
		// The fake strategy's Until is one real second away; the fast clock
		// reaches it in half a second.
		time.Sleep(499 * time.Millisecond)
		assert.True(t, lk.Valid())
		time.Sleep(2 * time.Millisecond)
		assert.False(t, lk.Valid(), "past Until by the lock's clock")
		assert.ErrorIs(t, lk.Err(), redlease.ErrLost)
		_, err := redlease.New(f, redlease.WithClock(nil))
		assert.ErrorIs(t, err, redlease.ErrInvalid)
	})
}

// Contradictory keeper options are refused by New with ErrInvalid, never a
// panic.
func TestDoKeeperOptionsInvalid(t *testing.T) {
	f := newFake()
	k := &keeper{}
	for name, opts := range map[string][]redlease.Option{
		"keeper then without": {redlease.WithKeeper(k), redlease.WithoutKeeper()},
		"without then keeper": {redlease.WithoutKeeper(), redlease.WithKeeper(k)},
		"nil keeper":          {redlease.WithKeeper(nil)},
	} {
		l, err := redlease.New(f, opts...)
		assert.ErrorIs(t, err, redlease.ErrInvalid, name)
		assert.Nil(t, l, name)
	}
	assert.Empty(t, k.kept)

	// WithoutKeeper on a call to TryLock is accepted and changes nothing.
	locker, err := redlease.New(f)
	require.NoError(t, err)
	lk, err := locker.TryLock(t.Context(), "k", redlease.WithoutKeeper())
	require.NoError(t, err)
	require.NoError(t, lk.Release(t.Context()))
}
