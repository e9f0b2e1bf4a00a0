package observe_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/single"
)

// upDown is the value of an up-down counter's data point for strategy, and
// whether there is one.
func upDown(data metricdata.Aggregation, strategy string) (int64, bool) {
	s, ok := data.(metricdata.Sum[int64])
	if !ok || s.IsMonotonic {
		return 0, false
	}
	for _, dp := range s.DataPoints {
		if has(dp.Attributes, attribute.String("redlease.strategy", strategy)) {
			return dp.Value, true
		}
	}
	return 0, false
}

// redlease.lock.held and redlease.lock.waiting count what is held and who
// waits now, and come back to zero after a release, a Lock that gave up at
// its deadline, a Lock that was cancelled, and a loss.
func TestHeldAndWaitingReturnToZero(t *testing.T) {
	s := redistest.Start(t, redistest.Config{})
	c := s.Client()
	strat, err := single.New(c)
	require.NoError(t, err)
	h := newHarness(t)
	locker, err := redlease.New(strat, redlease.WithTTL(5*time.Second), redlease.WithObserver(h.obs),
		redlease.WithRetryDelay(5*time.Millisecond, 20*time.Millisecond))
	require.NoError(t, err)
	ctx := t.Context()
	gauge := func(name string) int64 {
		t.Helper()
		v, ok := upDown(h.collect(t)[name].Data, "single")
		require.True(t, ok, "%s has a data point for single", name)
		return v
	}

	// Release.
	a, err := locker.TryLock(ctx, "a")
	require.NoError(t, err)
	b, err := locker.TryLock(ctx, "b")
	require.NoError(t, err)
	assert.EqualValues(t, 2, gauge("redlease.lock.held"), "two locks held")
	require.NoError(t, b.Release(ctx))
	assert.EqualValues(t, 1, gauge("redlease.lock.held"), "one released")

	// A Lock that gives up at its deadline: it counted as waiting (its
	// wait is recorded) and no longer does.
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = locker.Lock(tctx, "a")
	cancel()
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.EqualValues(t, 1, histogramCount(h.collect(t)["redlease.wait.duration"].Data,
		attribute.String("redlease.outcome", "not_obtained")), "the timed-out wait was observed")
	assert.Zero(t, gauge("redlease.lock.waiting"), "no waiter after the timeout")

	// A waiter seen waiting, then cancelled.
	wctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var werr error
	wg.Go(func() { _, werr = locker.Lock(wctx, "a") })
	var seen int64
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if v, ok := upDown(h.collect(t)["redlease.lock.waiting"].Data, "single"); ok && v == 1 {
			seen = v
			break
		}
	}
	stop()
	wg.Wait()
	assert.EqualValues(t, 1, seen, "the waiter counted while it waited")
	require.Error(t, werr)
	assert.Zero(t, gauge("redlease.lock.waiting"), "no waiter after the cancel")

	// Loss: someone else's token, found by an extension.
	require.NoError(t, c.Set(ctx, "a", "someone-else", 5*time.Second).Err())
	require.ErrorIs(t, a.Extend(ctx, 5*time.Second), redlease.ErrNotHeld)
	<-a.Lost()
	assert.Zero(t, gauge("redlease.lock.held"), "nothing held after the loss")
	assert.EqualValues(t, 1, sum(h.collect(t)["redlease.lock.lost"].Data, nil), "the loss is counted")

	// Released twice, or released after the loss: still zero, not below.
	assert.Error(t, a.Release(ctx))
	assert.Error(t, b.Release(ctx))
	assert.Zero(t, gauge("redlease.lock.held"), "a second release does not count twice")
}

// slowStrategy grants every call and answers extensions after delay (a
// round trip of known length); it extends in batches like quorum and
// single do.
type slowStrategy struct{ delay time.Duration }

func (s slowStrategy) Acquire(_ context.Context, _, _ string, ttl time.Duration) (redlease.Grant, error) {
	return redlease.Grant{Until: time.Now().Add(ttl), Fence: 1}, nil
}

func (s slowStrategy) Extend(_ context.Context, _, _ string, ttl time.Duration) (redlease.Grant, error) {
	start := time.Now()
	time.Sleep(s.delay)
	return redlease.Grant{Until: start.Add(ttl)}, nil
}

func (s slowStrategy) ExtendBatch(_ context.Context, items []redlease.Extension) []redlease.Extended {
	start := time.Now()
	time.Sleep(s.delay)
	out := make([]redlease.Extended, len(items))
	for i, it := range items {
		out[i].Grant = redlease.Grant{Until: start.Add(it.TTL)}
	}
	return out
}

func (s slowStrategy) Release(context.Context, string, string) error { return nil }

// redlease.renewal.duration is an extension's round trip to the strategy:
// with a strategy that takes 40 ms to answer (virtual time, so exactly),
// every renewal measures 40 ms, whether by Lock.Extend or by ExtendAll (a
// keeper's batch, reported after its round trip), and so does its span.
func TestRenewalDurationIsTheRoundTrip(t *testing.T) {
	const delay = 40 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t)
		locker, err := redlease.New(slowStrategy{delay}, redlease.WithTTL(10*time.Second), redlease.WithObserver(h.obs))
		require.NoError(t, err)
		ctx := t.Context()
		var locks []*redlease.Lock
		for _, k := range []string{"a", "b", "c"} {
			lk, err := locker.TryLock(ctx, k)
			require.NoError(t, err)
			locks = append(locks, lk)
		}
		require.NoError(t, locks[0].Extend(ctx, 10*time.Second))
		for i, err := range redlease.ExtendAll(ctx, locks) {
			require.NoError(t, err, "lock %d", i)
		}

		hist, ok := h.collect(t)["redlease.renewal.duration"].Data.(metricdata.Histogram[float64])
		require.True(t, ok, "redlease.renewal.duration is a float histogram")
		var n uint64
		for _, dp := range hist.DataPoints {
			n += dp.Count
			lo, _ := dp.Min.Value()
			hi, _ := dp.Max.Value()
			assert.InDelta(t, delay.Seconds(), lo, 1e-9, "the shortest renewal is the round trip")
			assert.InDelta(t, delay.Seconds(), hi, 1e-9, "the longest renewal is the round trip")
			assert.InDelta(t, float64(dp.Count)*delay.Seconds(), dp.Sum, 1e-9)
		}
		assert.EqualValues(t, 1+len(locks), n, "one Extend and three renewals of one batch")
		spans := 0
		for _, sp := range h.spans.Ended() {
			if sp.Name() == "redlease.extend" {
				spans++
				assert.Equal(t, delay, sp.EndTime().Sub(sp.StartTime()), "the span covers the round trip")
			}
		}
		assert.Equal(t, 1+len(locks), spans)
		for _, lk := range locks {
			require.NoError(t, lk.Release(ctx))
		}
	})
}
