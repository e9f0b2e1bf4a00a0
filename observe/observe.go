// Package observe reports what redlease locks do as OpenTelemetry metrics
// and trace spans, and as structured logs through log/slog.
//
// It uses the OpenTelemetry API only: by default the global providers,
// which do nothing until the program installs an SDK. Logs go nowhere
// unless WithLogger is given.
//
// # Metrics
//
//	redlease.acquire.duration  histogram, s   one attempt; strategy, outcome
//	redlease.wait.duration     histogram, s   Lock, every attempt until granted or given up; strategy, outcome
//	redlease.hold.duration     histogram, s   grant to release or loss; strategy, ended (released|lost)
//	redlease.renewals          counter        extensions (Extend, the watchdog); strategy, outcome
//	redlease.locks.lost        counter        locks lost while held; strategy
//	redlease.node.errors       counter        per-node failures inside an operation; strategy, op, node
//
// outcome is one of ok, not_obtained, not_held, unavailable, canceled,
// invalid, error. Keys are never metric attributes (unbounded
// cardinality); they are span attributes.
//
// # Traces
//
// One span per operation ("redlease.acquire", "redlease.wait",
// "redlease.extend", "redlease.release"), with one event per failed node.
package observe

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/redlease/redlease"
)

// Observer implements redlease.Observer. Create it with New and give it to
// redlease.WithObserver.
type Observer struct {
	tracer     trace.Tracer
	log        *slog.Logger
	acquire    metric.Float64Histogram
	wait       metric.Float64Histogram
	hold       metric.Float64Histogram
	renewals   metric.Int64Counter
	lost       metric.Int64Counter
	nodeErrors metric.Int64Counter
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

const scope = "github.com/redlease/redlease"

// New builds an Observer.
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
	m := c.mp.Meter(scope)
	o := &Observer{tracer: c.tp.Tracer(scope), log: c.log}
	var errs []error
	hist := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc))
		errs = append(errs, err)
		return h
	}
	count := func(name, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	o.acquire = hist("redlease.acquire.duration", "Duration of one acquisition attempt.")
	o.wait = hist("redlease.wait.duration", "Time Lock spent until the lock was obtained or it gave up.")
	o.hold = hist("redlease.hold.duration", "Time from grant to release or loss.")
	o.renewals = count("redlease.renewals", "Lock extensions, by outcome.")
	o.lost = count("redlease.locks.lost", "Locks lost while held.")
	o.nodeErrors = count("redlease.node.errors", "Failures of single nodes inside an operation.")
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return o, nil
}

// Start begins a span for op and returns the function that ends it and
// records the operation's metrics.
func (o *Observer) Start(ctx context.Context, op redlease.Op) (context.Context, func(error)) {
	start := time.Now()
	ctx, span := o.tracer.Start(ctx, "redlease."+op.Name, trace.WithAttributes(
		attribute.String("redlease.strategy", op.Strategy), attribute.String("redlease.key", op.Key)))
	return ctx, func(err error) {
		d := time.Since(start)
		outcome := Outcome(err)
		attrs := metric.WithAttributes(attribute.String("strategy", op.Strategy), attribute.String("outcome", outcome))
		switch op.Name {
		case "acquire":
			o.acquire.Record(ctx, d.Seconds(), attrs)
		case "wait":
			o.wait.Record(ctx, d.Seconds(), attrs)
		case "extend":
			o.renewals.Add(ctx, 1, attrs)
		}
		span.SetAttributes(attribute.String("redlease.outcome", outcome))
		if err != nil && outcome != "not_obtained" {
			span.SetStatus(codes.Error, err.Error())
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
	o.nodeErrors.Add(ctx, 1, metric.WithAttributes(attribute.String("strategy", op.Strategy),
		attribute.String("op", op.Name), attribute.String("node", nodeName(ne))))
	trace.SpanFromContext(ctx).AddEvent("node failed", trace.WithAttributes(attribute.Int("redlease.node", ne.Node),
		attribute.String("redlease.node.addr", ne.Addr), attribute.String("error", ne.Err.Error())))
	o.log.Debug("redlease node failed", "strategy", op.Strategy, "op", op.Name, "node", nodeName(ne), "err", ne.Err)
}

// Held records how long a lock was held and, if it was lost, the loss.
func (o *Observer) Held(op redlease.Op, d time.Duration, lost error) {
	ctx := context.Background()
	ended := "released"
	if lost != nil {
		ended = "lost"
		o.lost.Add(ctx, 1, metric.WithAttributes(attribute.String("strategy", op.Strategy)))
		o.log.Warn("redlease lock lost", "strategy", op.Strategy, "key", op.Key, "held", d, "err", lost)
	}
	o.hold.Record(ctx, d.Seconds(), metric.WithAttributes(attribute.String("strategy", op.Strategy), attribute.String("ended", ended)))
}

// Outcome classifies an operation's error for metrics.
func Outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, redlease.ErrNotObtained):
		return "canceled"
	case errors.Is(err, redlease.ErrInvalid):
		return "invalid"
	case errors.Is(err, redlease.ErrNotObtained):
		return "not_obtained"
	case errors.Is(err, redlease.ErrNotHeld), errors.Is(err, redlease.ErrLost):
		return "not_held"
	case errors.Is(err, redlease.ErrUnavailable):
		return "unavailable"
	}
	return "error"
}

func nodeName(ne *redlease.NodeError) string {
	if ne.Addr != "" {
		return ne.Addr
	}
	return "node" + strconv.Itoa(ne.Node)
}
