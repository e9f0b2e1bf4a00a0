package redlease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
)

// batchFake is a fake that extends in batches and counts the calls.
type batchFake struct {
	*fake
	mu      sync.Mutex
	batches int
}

func (b *batchFake) ExtendBatch(ctx context.Context, items []redlease.Extension) []redlease.Extended {
	b.mu.Lock()
	b.batches++
	b.mu.Unlock()
	out := make([]redlease.Extended, len(items))
	for i, it := range items {
		g, err := b.Extend(ctx, it.Key, it.Token, it.TTL)
		out[i] = redlease.Extended{Grant: g, Err: err}
	}
	return out
}

func TestExtendAllBatchesPerStrategy(t *testing.T) {
	batch := &batchFake{fake: newFake()}
	plain := newFake()
	ctx := t.Context()
	var locks []*redlease.Lock
	for _, key := range []string{"a", "b", "c"} {
		locker, err := redlease.New(batch, redlease.WithTTL(time.Minute))
		require.NoError(t, err)
		lk, err := locker.TryLock(ctx, key)
		require.NoError(t, err)
		locks = append(locks, lk)
	}
	locker2, err := redlease.New(plain, redlease.WithTTL(time.Minute))
	require.NoError(t, err)
	lk, err := locker2.TryLock(ctx, "d")
	require.NoError(t, err)
	locks = append(locks, lk)
	before := locks[0].Until()

	delete(batch.held, "b") // b was taken from us behind our back
	time.Sleep(time.Millisecond)
	errs := redlease.ExtendAll(ctx, locks)

	assert.Equal(t, 1, batch.batches, "one batch call for the three locks of one strategy")
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], redlease.ErrNotHeld)
	assert.NoError(t, errs[2])
	assert.NoError(t, errs[3])
	assert.True(t, locks[0].Until().After(before), "Until moves")
	assert.ErrorIs(t, locks[1].Err(), redlease.ErrLost, "a lock found not held is marked lost")

	require.NoError(t, locks[0].Release(ctx))
	errs = redlease.ExtendAll(ctx, locks[:1])
	assert.ErrorIs(t, errs[0], redlease.ErrNotHeld, "a released lock is not extended")
}
