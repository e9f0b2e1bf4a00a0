package observe

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/redlease/redlease"
)

// ScopeName is the name of the instrumentation scope of every metric and
// span this package reports: its import path.
const ScopeName = "github.com/redlease/redlease/observe"

// Version is the version of the instrumentation scope. It versions the
// telemetry this package reports (instrument names, units, attributes,
// bucket boundaries; see the package documentation) and changes whenever
// any of them does. The unversioned first cut, under the scope name
// "github.com/redlease/redlease", had bare attribute names (strategy,
// outcome, node), no units on counters and the SDK's default buckets.
const Version = "0.3.0"

// Bucket boundaries, in seconds, advised for the histograms. The package
// documentation lists them; keep the two in step.
var (
	// latencyBuckets suit one acquisition (sub-millisecond on a LAN, up to
	// node timeouts) and Lock's waiting (up to tens of seconds).
	latencyBuckets = []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	// holdBuckets suit holds from a short critical section to an hour-long
	// job kept alive by a watchdog.
	holdBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}
)

// Observer implements redlease.Observer. Create it with New and give it to
// redlease.WithObserver. It is safe for concurrent use.
type Observer struct {
	tracer     trace.Tracer
	log        *slog.Logger
	acquire    metric.Float64Histogram
	wait       metric.Float64Histogram
	hold       metric.Float64Histogram
	renewal    metric.Float64Histogram
	renewals   metric.Int64Counter
	lost       metric.Int64Counter
	nodeErrors metric.Int64Counter
	held       metric.Int64UpDownCounter
	waiting    metric.Int64UpDownCounter
}

var _ redlease.Observer = (*Observer)(nil)

// Option configures an Observer.
type Option func(*config)

type config struct {
	mp  metric.MeterProvider
	tp  trace.TracerProvider
	log *slog.Logger
}

// WithMeterProvider sets where metrics go. Default otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option { return func(c *config) { c.mp = mp } }

// WithTracerProvider sets where spans go. Default otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option { return func(c *config) { c.tp = tp } }

// WithLogger logs failures and lost locks to l (Warn) and every operation
// (Debug). Default: no logs.
func WithLogger(l *slog.Logger) Option { return func(c *config) { c.log = l } }

// New builds an Observer. It fails with redlease.ErrInvalid for a nil
// provider or logger, and with the meter's error if an instrument cannot be
// created.
func New(opts ...Option) (*Observer, error) {
	c := config{mp: otel.GetMeterProvider(), tp: otel.GetTracerProvider(), log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	if c.mp == nil || c.tp == nil || c.log == nil {
		return nil, redlease.Invalid("observe: nil provider or logger")
	}
	m := c.mp.Meter(ScopeName, metric.WithInstrumentationVersion(Version), metric.WithSchemaURL(semconv.SchemaURL))
	o := &Observer{
		tracer: c.tp.Tracer(ScopeName, trace.WithInstrumentationVersion(Version), trace.WithSchemaURL(semconv.SchemaURL)),
		log:    c.log,
	}
	var errs []error
	hist := func(name, desc string, bounds []float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(bounds...))
		errs = append(errs, err)
		return h
	}
	count := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	upDown := func(name, unit, desc string) metric.Int64UpDownCounter {
		c, err := m.Int64UpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	o.acquire = hist("redlease.acquire.duration", "Duration of one acquisition attempt.", latencyBuckets)
	o.wait = hist("redlease.wait.duration", "Time Lock spent until the lock was obtained or it gave up.", latencyBuckets)
	o.hold = hist("redlease.hold.duration", "Time from grant to release or loss.", holdBuckets)
	o.renewal = hist("redlease.renewal.duration", "Round trip of one extension to the strategy's nodes.", latencyBuckets)
	o.renewals = count("redlease.renewals", "{renewal}", "Lock extensions, by outcome.")
	o.lost = count("redlease.lock.lost", "{lock}", "Locks lost while held.")
	o.held = upDown("redlease.lock.held", "{lock}", "Locks held now: granted and not yet released or lost.")
	o.waiting = upDown("redlease.lock.waiting", "{waiter}", "Lock calls waiting now for a lock.")
	o.nodeErrors = count("redlease.node.errors", "{error}", "Failures of single nodes inside an operation.")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return o, nil
}

// Start begins a span for op and returns the function that ends it and
// records the operation's metrics.
// An operation that began before the call (op.Began, a keeper's renewal
// reported after its round trip) is measured, and its span starts, from
// op.Began.
func (o *Observer) Start(ctx context.Context, op redlease.Op) (context.Context, func(error)) {
	start := op.Began
	if start.IsZero() {
		start = time.Now()
	}
	ctx, span := o.tracer.Start(ctx, "redlease."+op.Name, trace.WithTimestamp(start), trace.WithAttributes(
		keyStrategy.String(op.Strategy), keyOperation.String(op.Name), keyKey.String(op.Key)))
	if op.Name == "wait" {
		o.waiting.Add(ctx, 1, metric.WithAttributes(keyStrategy.String(op.Strategy)))
	}
	return ctx, func(err error) {
		d := time.Since(start)
		outcome := Outcome(err)
		attrs := []attribute.KeyValue{keyStrategy.String(op.Strategy), keyOutcome.String(outcome)}
		span.SetAttributes(keyOutcome.String(outcome))
		bad := failed(err, outcome)
		if bad {
			et := semconv.ErrorTypeKey.String(ErrorType(err))
			attrs = append(attrs, et)
			span.SetAttributes(et)
			span.SetStatus(codes.Error, err.Error())
		}
		switch op.Name {
		case "acquire", "acquire_set":
			o.acquire.Record(ctx, d.Seconds(), metric.WithAttributes(attrs...))
			if err == nil { // a grant (of each key of a set): held until Held reports its end
				o.held.Add(ctx, int64(max(1, len(op.Keys))), metric.WithAttributes(keyStrategy.String(op.Strategy)))
			}
		case "wait":
			o.wait.Record(ctx, d.Seconds(), metric.WithAttributes(attrs...))
			o.waiting.Add(ctx, -1, metric.WithAttributes(keyStrategy.String(op.Strategy)))
		case "extend":
			o.renewal.Record(ctx, d.Seconds(), metric.WithAttributes(attrs...))
			o.renewals.Add(ctx, 1, metric.WithAttributes(attrs...))
		}
		if bad {
			o.log.Warn("redlease "+op.Name+" failed", "strategy", op.Strategy, "key", op.Key, "outcome", outcome, "err", err)
		} else {
			o.log.Debug("redlease "+op.Name, "strategy", op.Strategy, "key", op.Key, "outcome", outcome, "took", d)
		}
		span.End()
	}
}

// NodeFailed counts one node's failure and adds it to the operation's span
// as an event.
func (o *Observer) NodeFailed(ctx context.Context, op redlease.Op, ne *redlease.NodeError) {
	node := nodeAttrs(ne)
	et := semconv.ErrorTypeKey.String(errorTypeOther)
	if ne.Err != nil {
		et = semconv.ErrorTypeKey.String(ErrorType(ne.Err))
	}
	attrs := make([]attribute.KeyValue, 0, len(node)+3)
	attrs = append(attrs, keyStrategy.String(op.Strategy), keyOperation.String(op.Name), et)
	attrs = append(attrs, node...)
	o.nodeErrors.Add(ctx, 1, metric.WithAttributes(attrs...))
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		event := make([]attribute.KeyValue, 0, len(node)+2)
		event = append(event, node...)
		event = append(event, et, semconv.ExceptionMessage(errText(ne.Err)))
		span.AddEvent("redlease.node.failed", trace.WithAttributes(event...))
	}
	o.log.Debug("redlease node failed", "strategy", op.Strategy, "op", op.Name, "node", ne.Node, "addr", ne.Addr, "err", ne.Err)
}

// Held records how long a lock was held and, if it was lost, the loss, and
// takes the lock out of the count of held locks.
func (o *Observer) Held(op redlease.Op, d time.Duration, lost error) {
	ctx := context.Background()
	strategy := keyStrategy.String(op.Strategy)
	o.held.Add(ctx, -1, metric.WithAttributes(strategy))
	if lost == nil {
		o.hold.Record(ctx, d.Seconds(), metric.WithAttributes(strategy, keyEnded.String("released")))
		return
	}
	et := semconv.ErrorTypeKey.String(ErrorType(lost))
	o.lost.Add(ctx, 1, metric.WithAttributes(strategy, et))
	o.hold.Record(ctx, d.Seconds(), metric.WithAttributes(strategy, keyEnded.String("lost"), et))
	o.log.Warn("redlease lock lost", "strategy", op.Strategy, "key", op.Key, "held", d, "err", lost)
}

// errText is err's text, or "<nil>" for a NodeError without a cause.
func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
