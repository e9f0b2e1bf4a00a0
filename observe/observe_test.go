package observe_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.uber.org/goleak"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/observe"
	"github.com/redlease/redlease/quorum"
)

func TestMain(m *testing.M) {
	redistest.QuietClientLogs()
	goleak.VerifyTestMain(m)
}

// Five quorum nodes, one of them down: grants, a lost lock and the dead
// node's failures show up as metrics read through an in-memory reader, and
// as spans with per-node events.
func TestMetricsWithOneNodeDown(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	servers := redistest.StartN(t, 5, redistest.Config{})
	clients := make([]redis.UniversalClient, 5)
	for i, s := range servers {
		// No go-redis retries: a refused node fails at once, inside the
		// operation's span (with retries it fails at the round's deadline,
		// after the span, and shows in the metrics only).
		c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
		t.Cleanup(func() { _ = c.Close() })
		clients[i] = c
	}
	// Every grant needs three live nodes to answer: a node timeout only a
	// hang misses (not a window a slow machine can miss). The killed nodes
	// refuse at once; no step waits for the timeout.
	s, err := quorum.New(clients, quorum.WithNodeTimeout(10*time.Second), quorum.WithoutFencing())
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	var logs strings.Builder
	obs, err := observe.New(observe.WithMeterProvider(mp), observe.WithTracerProvider(tp),
		observe.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	require.NoError(t, err)
	locker, err := redlease.New(s, redlease.WithTTL(5*time.Second), redlease.WithObserver(obs))
	require.NoError(t, err)
	ctx := t.Context()

	servers[4].Kill()
	// A release returns at a quorum and finishes on the other nodes in the
	// background; the next single attempt needs 3 of the 4 live nodes, so
	// wait (bounded) until the key is gone from all of them.
	gone := func() bool {
		for _, c := range clients[:4] {
			if c.Exists(ctx, "job").Val() != 0 {
				return false
			}
		}
		return true
	}
	const grants = 5
	for i := range grants {
		lk, err := locker.TryLock(ctx, "job")
		require.NoError(t, err, "attempt %d", i)
		require.NoError(t, lk.Release(ctx))
		probe.WaitFor(t, 5*time.Second, 3, time.Millisecond, gone, "attempt %d: the released key is still on a live node", i)
	}
	// One lock lost: someone else's token on three of five nodes (written
	// over the key, so that a write of the acquisition still on its way
	// cannot bring it back), and an extension finds out.
	lk, err := locker.TryLock(ctx, "job")
	require.NoError(t, err)
	for _, c := range clients[:3] {
		require.NoError(t, c.Set(ctx, "job", "someone-else", 5*time.Second).Err())
	}
	require.ErrorIs(t, lk.Extend(ctx, 5*time.Second), redlease.ErrNotHeld)
	<-lk.Lost()

	dead := attribute.Int("server.port", servers[4].Port)
	got := map[string]metricdata.Aggregation{}
	collect := func() {
		var rm metricdata.ResourceMetrics
		require.NoError(t, reader.Collect(ctx, &rm))
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				got[m.Name] = m.Data
			}
		}
	}
	// A dead node's requests fail at the round's deadline, after the
	// operation returned at a majority: wait (bounded) for them to count.
	probe.WaitFor(t, 5*time.Second, 3, 50*time.Millisecond, func() bool {
		collect()
		return sum(got["redlease.node.errors"], &dead) >= grants
	}, "the dead node's failures, at least one per acquisition, never counted")
	acquired := histogramCount(got["redlease.acquire.duration"], attribute.String("redlease.outcome", "ok"))
	assert.EqualValues(t, grants+1, acquired, "grants")
	assert.EqualValues(t, 1, sum(got["redlease.lock.lost"], nil), "lost locks")
	assert.EqualValues(t, 1, sum(got["redlease.renewals"], ptr(attribute.String("redlease.outcome", "not_held"))), "failed renewal")
	assert.GreaterOrEqual(t, sum(got["redlease.node.errors"], &dead), int64(grants), "the dead node's failures, at least one per acquisition")
	assert.EqualValues(t, grants, histogramCount(got["redlease.hold.duration"], attribute.String("redlease.ended", "released")))
	// The dead node is named by server.address and server.port, and its
	// failures are classified (a refused or broken connection, a timeout),
	// never by their text.
	if s, ok := got["redlease.node.errors"].(metricdata.Sum[int64]); assert.True(t, ok) {
		for _, dp := range s.DataPoints {
			if !has(dp.Attributes, dead) {
				continue
			}
			assert.True(t, has(dp.Attributes, attribute.String("server.address", "127.0.0.1")), "server.address")
			et, _ := dp.Attributes.Value("error.type")
			assert.Contains(t, []string{"connection_refused", "connection_reset", "io.EOF", "timeout"}, et.AsString(), "error.type")
		}
	}

	// With a majority down the acquisition fails once the failures are in,
	// so they land inside its span, one event per failed node.
	servers[2].Kill()
	servers[3].Kill()
	_, err = locker.TryLock(ctx, "job2")
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	t.Logf("the failed acquisition: %v", err)
	var events, acquireSpans int
	for _, sp := range spans.Ended() {
		if sp.Name() == "redlease.acquire" {
			acquireSpans++
		}
		for _, e := range sp.Events() {
			if e.Name == "redlease.node.failed" {
				events++
			}
		}
	}
	assert.Equal(t, grants+2, acquireSpans, "one span per acquisition attempt")
	// The two nodes killed just now refuse at once: their failures are in
	// the span. The node dead from the start may instead be silent until
	// the node timeout (go-redis retries dials to it, and the quorum asks
	// it for its run_id at first contact): then it is named in the error
	// as silent, not as a span event.
	assert.GreaterOrEqual(t, events, 2, "per-node span events for the failed acquisition")
	if events < 3 {
		assert.Contains(t, err.Error(), "no reply within the node timeout", "the third failed node is named in the error")
	}
	assert.Contains(t, logs.String(), "redlease lock lost")
	t.Logf("grants %d, node errors on the dead node %d, span events %d", acquired, sum(got["redlease.node.errors"], &dead), events)
}

func ptr(kv attribute.KeyValue) *attribute.KeyValue { return &kv }

// sum adds the data points of a counter, filtered by one attribute.
func sum(data metricdata.Aggregation, want *attribute.KeyValue) int64 {
	s, ok := data.(metricdata.Sum[int64])
	if !ok {
		return 0
	}
	var n int64
	for _, dp := range s.DataPoints {
		if want == nil || has(dp.Attributes, *want) {
			n += dp.Value
		}
	}
	return n
}

func histogramCount(data metricdata.Aggregation, want attribute.KeyValue) uint64 {
	h, ok := data.(metricdata.Histogram[float64])
	if !ok {
		return 0
	}
	var n uint64
	for _, dp := range h.DataPoints {
		if has(dp.Attributes, want) {
			n += dp.Count
		}
	}
	return n
}

func has(set attribute.Set, kv attribute.KeyValue) bool {
	v, ok := set.Value(kv.Key)
	return ok && v == kv.Value
}
