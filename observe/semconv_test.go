package observe_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/observe"
	"github.com/redlease/redlease/single"
)

// The boundaries the package documentation promises.
var (
	latencyBounds = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	holdBounds    = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
)

// harness is an Observer wired to an in-memory metric reader and span
// recorder.
type harness struct {
	obs    *observe.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	obs, err := observe.New(observe.WithMeterProvider(mp), observe.WithTracerProvider(tp))
	require.NoError(t, err)
	return &harness{obs: obs, reader: reader, spans: spans}
}

// collect returns every metric by name, failing on a metric outside the
// package's scope.
func (h *harness) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, h.reader.Collect(t.Context(), &rm))
	got := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		assert.Equal(t, observe.ScopeName, sm.Scope.Name, "scope name")
		assert.Equal(t, observe.Version, sm.Scope.Version, "scope version")
		assert.Equal(t, semconv.SchemaURL, sm.Scope.SchemaURL, "scope schema URL")
		for _, m := range sm.Metrics {
			got[m.Name] = m
		}
	}
	return got
}

// A 2 ms acquisition (a real redis-server 2 ms away, through a latency
// proxy) lands in a bucket of its own, not the first one, as it did with
// the SDK's default millisecond-oriented boundaries.
func TestTwoMillisecondAcquireIsNotInFirstBucket(t *testing.T) {
	server := redistest.Start(t, redistest.Config{})
	proxy := redistest.NewGate(t, server.Addr)
	client := proxy.Client()
	ctx := t.Context()
	// A pooled connection and the scripts loaded, before the latency: the
	// acquisition below is one round trip.
	strategy, err := single.New(client)
	require.NoError(t, err)
	locker2, err := redlease.New(strategy)
	require.NoError(t, err)
	warm, err := locker2.TryLock(ctx, t.Name()+":warm")
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))
	proxy.Delay(2 * time.Millisecond)

	h := newHarness(t)
	strategy2, err := single.New(client)
	require.NoError(t, err)
	locker, err := redlease.New(strategy2, redlease.WithTTL(5*time.Second), redlease.WithObserver(h.obs))
	require.NoError(t, err)
	lk, err := locker.TryLock(ctx, t.Name())
	require.NoError(t, err)
	require.NoError(t, lk.Release(ctx))

	m, ok := h.collect(t)["redlease.acquire.duration"]
	require.True(t, ok, "acquire histogram reported")
	assert.Equal(t, "s", m.Unit)
	hist, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "a float histogram, got %T", m.Data)
	require.Len(t, hist.DataPoints, 1)
	dp := hist.DataPoints[0]
	assert.Equal(t, latencyBounds, dp.Bounds, "advised boundaries")
	require.EqualValues(t, 1, dp.Count)
	minimum, _ := dp.Min.Value()
	assert.GreaterOrEqual(t, minimum, 0.002, "the acquisition took at least the proxy's 2 ms")
	assert.Zero(t, dp.BucketCounts[0], "first bucket (<= %gs) is empty", dp.Bounds[0])
	at := slices.IndexFunc(dp.BucketCounts, func(n uint64) bool { return n > 0 })
	require.Positive(t, at, "one bucket counts the acquisition")
	require.Less(t, at, len(dp.Bounds), "not the overflow bucket")
	// With the SDK's default boundaries it would share (0, 5] with
	// everything up to five seconds.
	assert.GreaterOrEqual(t, dp.Bounds[at-1], 0.001, "lower bound of its bucket")
	assert.LessOrEqual(t, dp.Bounds[at], 0.025, "upper bound of its bucket")
	t.Logf("acquire took %.4fs: bucket %d, (%g, %g]", minimum, at, dp.Bounds[at-1], dp.Bounds[at])
}

// Every instrument has its unit, its advised boundaries and namespaced
// attributes only; failures carry error.type, refusals and successes do
// not; keys stay on spans. The Observer is driven directly: nothing here
// depends on timing.
func TestInstrumentsUnitsAndAttributes(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	op := func(name string) redlease.Op { return redlease.Op{Name: name, Strategy: "quorum", Key: "order:42"} }

	actx, done := h.obs.Start(ctx, op("acquire"))
	h.obs.NodeFailed(actx, op("acquire"), &redlease.NodeError{Node: 2, Addr: "10.1.2.3:6380",
		Err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}})
	done(nil)
	_, done = h.obs.Start(ctx, op("acquire"))
	done(redlease.ErrNotObtained)
	_, done = h.obs.Start(ctx, op("wait"))
	done(errors.Join(redlease.ErrNotObtained, context.DeadlineExceeded))
	_, done = h.obs.Start(ctx, op("extend"))
	done(nil)
	_, done = h.obs.Start(ctx, op("extend"))
	done(fmt.Errorf("%w: extend refused", redlease.ErrNotHeld))
	_, done = h.obs.Start(ctx, op("release"))
	done(nil)
	h.obs.Held(op("hold"), 40*time.Millisecond, nil)
	h.obs.Held(op("hold"), 3*time.Second, fmt.Errorf("%w: order:42: %w", redlease.ErrLost, redlease.ErrNotHeld))

	got := h.collect(t)
	units := map[string]string{
		"redlease.acquire.duration": "s",
		"redlease.wait.duration":    "s",
		"redlease.hold.duration":    "s",
		"redlease.renewal.duration": "s",
		"redlease.renewals":         "{renewal}",
		"redlease.lock.lost":        "{lock}",
		"redlease.lock.held":        "{lock}",
		"redlease.lock.waiting":     "{waiter}",
		"redlease.node.errors":      "{error}",
	}
	allowed := map[string][]attribute.Key{
		"redlease.acquire.duration": {"redlease.strategy", "redlease.outcome", "error.type"},
		"redlease.wait.duration":    {"redlease.strategy", "redlease.outcome", "error.type"},
		"redlease.hold.duration":    {"redlease.strategy", "redlease.ended", "error.type"},
		"redlease.renewal.duration": {"redlease.strategy", "redlease.outcome", "error.type"},
		"redlease.renewals":         {"redlease.strategy", "redlease.outcome", "error.type"},
		"redlease.lock.lost":        {"redlease.strategy", "error.type"},
		"redlease.lock.held":        {"redlease.strategy"},
		"redlease.lock.waiting":     {"redlease.strategy"},
		"redlease.node.errors": {"redlease.strategy", "redlease.operation", "redlease.node.index",
			"server.address", "server.port", "error.type"},
	}
	assert.Len(t, got, len(units), "instruments reported")
	for name, unit := range units {
		m, ok := got[name]
		if !assert.True(t, ok, "%s reported", name) {
			continue
		}
		assert.Equal(t, unit, m.Unit, "%s unit", name)
		assert.NotEmpty(t, m.Description, "%s description", name)
		for _, set := range attributeSets(m.Data) {
			for _, kv := range set.ToSlice() {
				assert.Contains(t, allowed[name], kv.Key, "%s: attribute %s", name, kv.Key)
			}
		}
	}
	assert.Equal(t, latencyBounds, bounds(got["redlease.wait.duration"].Data))
	assert.Equal(t, holdBounds, bounds(got["redlease.hold.duration"].Data))
	assert.Equal(t, latencyBounds, bounds(got["redlease.renewal.duration"].Data))

	// Exact attribute sets of each data point.
	strategy := attribute.String("redlease.strategy", "quorum")
	assert.ElementsMatch(t, []attribute.Set{
		attribute.NewSet(strategy, attribute.String("redlease.outcome", "ok")),
		attribute.NewSet(strategy, attribute.String("redlease.outcome", "not_obtained")),
	}, attributeSets(got["redlease.acquire.duration"].Data), "a refusal is not a failure: no error.type")
	assert.ElementsMatch(t, []attribute.Set{
		attribute.NewSet(strategy, attribute.String("redlease.outcome", "not_obtained")),
	}, attributeSets(got["redlease.wait.duration"].Data), "Lock that gave up at its deadline")
	assert.ElementsMatch(t, []attribute.Set{
		attribute.NewSet(strategy, attribute.String("redlease.outcome", "ok")),
		attribute.NewSet(strategy, attribute.String("redlease.outcome", "not_held"), attribute.String("error.type", "redlease.ErrNotHeld")),
	}, attributeSets(got["redlease.renewals"].Data))
	assert.ElementsMatch(t, []attribute.Set{
		attribute.NewSet(strategy, attribute.String("error.type", "redlease.ErrNotHeld")),
	}, attributeSets(got["redlease.lock.lost"].Data), "a loss is classified by its cause")
	assert.ElementsMatch(t, []attribute.Set{
		attribute.NewSet(strategy, attribute.String("redlease.ended", "released")),
		attribute.NewSet(strategy, attribute.String("redlease.ended", "lost"), attribute.String("error.type", "redlease.ErrNotHeld")),
	}, attributeSets(got["redlease.hold.duration"].Data))
	assert.ElementsMatch(t, []attribute.Set{
		attribute.NewSet(strategy, attribute.String("redlease.operation", "acquire"), attribute.Int("redlease.node.index", 2),
			attribute.String("server.address", "10.1.2.3"), attribute.Int("server.port", 6380),
			attribute.String("error.type", "connection_refused")),
	}, attributeSets(got["redlease.node.errors"].Data))

	// Spans: same scope, same attribute names, plus the key.
	ended := h.spans.Ended()
	require.Len(t, ended, 6)
	for _, sp := range ended {
		assert.Equal(t, observe.ScopeName, sp.InstrumentationScope().Name)
		assert.Equal(t, observe.Version, sp.InstrumentationScope().Version)
		assert.Equal(t, semconv.SchemaURL, sp.InstrumentationScope().SchemaURL)
		attrs := attribute.NewSet(sp.Attributes()...)
		for _, k := range []attribute.Key{"redlease.strategy", "redlease.operation", "redlease.key", "redlease.outcome"} {
			assert.True(t, attrs.HasValue(k), "span %s: attribute %s", sp.Name(), k)
		}
		assert.Equal(t, sp.Name(), "redlease."+value(attrs, "redlease.operation"))
		failed := value(attrs, "redlease.outcome") != "ok" && value(attrs, "redlease.outcome") != "not_obtained"
		assert.Equal(t, failed, attrs.HasValue("error.type"), "span %s: error.type iff failed", sp.Name())
		assert.Equal(t, failed, sp.Status().Code == codes.Error, "span %s: error status iff failed", sp.Name())
	}
	first := ended[0]
	require.Len(t, first.Events(), 1, "the failed node's event")
	event := first.Events()[0]
	assert.Equal(t, "redlease.node.failed", event.Name)
	eattrs := attribute.NewSet(event.Attributes...)
	assert.Equal(t, "10.1.2.3", value(eattrs, "server.address"))
	assert.Equal(t, "6380", value(eattrs, "server.port"))
	assert.Equal(t, "2", value(eattrs, "redlease.node.index"))
	assert.Equal(t, "connection_refused", value(eattrs, "error.type"))
	assert.Contains(t, value(eattrs, "exception.message"), "connection refused", "the full text, on spans only")
}

// A node's address becomes server.address and server.port; one without a
// port keeps server.address only; none leaves the index alone.
func TestNodeAddressAttributes(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want []attribute.KeyValue
	}{
		{"redis-1.internal:6379", []attribute.KeyValue{attribute.String("server.address", "redis-1.internal"), attribute.Int("server.port", 6379)}},
		{"[::1]:7000", []attribute.KeyValue{attribute.String("server.address", "::1"), attribute.Int("server.port", 7000)}},
		{"/var/run/redis.sock", []attribute.KeyValue{attribute.String("server.address", "/var/run/redis.sock")}},
		{"", nil},
	} {
		t.Run(tc.addr, func(t *testing.T) {
			h := newHarness(t)
			h.obs.NodeFailed(t.Context(), redlease.Op{Name: "extend", Strategy: "single"},
				&redlease.NodeError{Node: 0, Addr: tc.addr, Err: context.DeadlineExceeded})
			want := append([]attribute.KeyValue{attribute.String("redlease.strategy", "single"),
				attribute.String("redlease.operation", "extend"), attribute.Int("redlease.node.index", 0),
				attribute.String("error.type", "timeout")}, tc.want...)
			got := attributeSets(h.collect(t)["redlease.node.errors"].Data)
			assert.Equal(t, []attribute.Set{attribute.NewSet(want...)}, got)
		})
	}
}

func TestOutcome(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, "ok"},
		{redlease.ErrNotObtained, "not_obtained"},
		{errors.Join(redlease.ErrNotObtained, context.DeadlineExceeded), "not_obtained"},
		{errors.Join(redlease.ErrNotObtained, context.Canceled), "canceled"},
		{errors.Join(redlease.ErrNotObtained, redlease.ErrUnavailable), "unavailable"},
		{redlease.ErrUnavailable, "unavailable"},
		// Refused by a majority while another node timed out.
		{errors.Join(redlease.ErrNotHeld, &redlease.NodeError{Node: 1, Err: context.DeadlineExceeded}), "not_held"},
		{fmt.Errorf("%w: k: %w", redlease.ErrLost, errors.New("validity ran out")), "not_held"},
		{redlease.Invalid("empty key"), "invalid"},
		{context.DeadlineExceeded, "canceled"},
		{errors.New("boom"), "error"},
	} {
		if got := observe.Outcome(tc.err); got != tc.want {
			t.Errorf("Outcome(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

func TestErrorType(t *testing.T) {
	// Redis error replies, as go-redis returns them.
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	reply := func(msg string) error {
		err := c.Eval(t.Context(), "return redis.error_reply(ARGV[1])", nil, msg).Err()
		require.Error(t, err)
		return err
	}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{redlease.Invalid("empty key"), "redlease.ErrInvalid"},
		{errors.Join(redlease.ErrNotObtained, context.Canceled), "context.Canceled"},
		{errors.Join(redlease.ErrNotObtained, redlease.ErrUnavailable, &redlease.NodeError{Err: context.DeadlineExceeded}), "redlease.ErrUnavailable"},
		{redlease.ErrNotObtained, "redlease.ErrNotObtained"},
		{errors.Join(redlease.ErrNotHeld, &redlease.NodeError{Node: 1, Err: context.DeadlineExceeded}), "redlease.ErrNotHeld"},
		{fmt.Errorf("%w: k: %w", redlease.ErrLost, failover.ErrFailover), "failover.ErrFailover"},
		{fmt.Errorf("%w: k: %w", redlease.ErrLost, errors.New("validity ran out")), "redlease.ErrLost"},
		{failover.ErrNotReplicated, "failover.ErrNotReplicated"},
		{&redlease.NodeError{Err: context.DeadlineExceeded}, "timeout"},
		{&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, "timeout"},
		{&redlease.NodeError{Err: refused}, "connection_refused"},
		{fmt.Errorf("write: %w", syscall.EPIPE), "connection_reset"},
		{&redlease.NodeError{Err: fmt.Errorf("read reply: %w", io.EOF)}, "io.EOF"},
		{redis.ErrClosed, "redis.ErrClosed"},
		{redis.ErrNoScript, "NOSCRIPT"},
		{reply("READONLY You can't write against a read only replica."), "READONLY"},
		{reply("LOADING Redis is loading the dataset in memory"), "LOADING"},
		{reply("NOPERM this user has no permissions"), "NOPERM"},
		{reply("ERR user_script:1: something odd"), "redis.Error"},
		{errors.New("boom"), "_OTHER"},
	} {
		if got := observe.ErrorType(tc.err); got != tc.want {
			t.Errorf("ErrorType(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

func bounds(data metricdata.Aggregation) []float64 {
	if h, ok := data.(metricdata.Histogram[float64]); ok && len(h.DataPoints) > 0 {
		return h.DataPoints[0].Bounds
	}
	return nil
}

// attributeSets lists the attribute sets of every data point.
func attributeSets(data metricdata.Aggregation) []attribute.Set {
	var sets []attribute.Set
	switch d := data.(type) {
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			sets = append(sets, dp.Attributes)
		}
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			sets = append(sets, dp.Attributes)
		}
	}
	return sets
}

func value(set attribute.Set, k attribute.Key) string {
	v, _ := set.Value(k)
	return v.Emit()
}
