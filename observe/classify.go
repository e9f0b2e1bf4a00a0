package observe

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"syscall"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
)

// Outcomes, the values of redlease.outcome.
const (
	outcomeOK           = "ok"
	outcomeNotObtained  = "not_obtained"
	outcomeNotHeld      = "not_held"
	outcomeUnavailable  = "unavailable"
	outcomeCanceled     = "canceled"
	outcomeInvalid      = "invalid"
	outcomeError        = "error"
	errorTypeOther      = "_OTHER"
	errorTypeRedisError = "redis.Error"
)

// Outcome classifies an operation's error for the redlease.outcome
// attribute:
//
//	ok            err is nil
//	invalid       errors.Is(err, redlease.ErrInvalid)
//	canceled      errors.Is(err, context.Canceled): the caller gave up
//	unavailable   errors.Is(err, redlease.ErrUnavailable): failures, not refusals, decided
//	not_obtained  errors.Is(err, redlease.ErrNotObtained), including a Lock whose ctx deadline passed
//	not_held      errors.Is(err, redlease.ErrNotHeld) or redlease.ErrLost
//	canceled      errors.Is(err, context.DeadlineExceeded), with none of the above
//	error         anything else
//
// The first line that matches wins, so an extension refused by a majority
// while another node timed out is not_held, not canceled.
func Outcome(err error) string {
	switch {
	case err == nil:
		return outcomeOK
	case errors.Is(err, redlease.ErrInvalid):
		return outcomeInvalid
	case errors.Is(err, context.Canceled):
		return outcomeCanceled
	case errors.Is(err, redlease.ErrUnavailable):
		return outcomeUnavailable
	case errors.Is(err, redlease.ErrNotObtained):
		return outcomeNotObtained
	case errors.Is(err, redlease.ErrNotHeld), errors.Is(err, redlease.ErrLost):
		return outcomeNotHeld
	case errors.Is(err, context.DeadlineExceeded):
		return outcomeCanceled
	}
	return outcomeError
}

// failed reports whether an operation that ended with err counts as a
// failure: an error other than a refusal (not_obtained).
func failed(err error, outcome string) bool {
	return err != nil && outcome != outcomeNotObtained
}

// sentinels are the errors ErrorType names after themselves, most specific
// first, ahead of the causes they may wrap.
var sentinels = []struct {
	err  error
	name string
}{
	{redlease.ErrInvalid, "redlease.ErrInvalid"},
	{context.Canceled, "context.Canceled"},
	{failover.ErrFailover, "failover.ErrFailover"},
	{failover.ErrNotReplicated, "failover.ErrNotReplicated"},
	{redlease.ErrUnavailable, "redlease.ErrUnavailable"},
	{redlease.ErrNotObtained, "redlease.ErrNotObtained"},
	{redlease.ErrNotHeld, "redlease.ErrNotHeld"},
}

// causes are the errors of the network and of Redis, after the timeout
// check, by errors.Is.
var causes = []struct {
	err  error
	name string
}{
	{redis.ErrClosed, "redis.ErrClosed"},
	{redis.ErrPoolExhausted, "redis.ErrPoolExhausted"},
	{syscall.ECONNREFUSED, "connection_refused"},
	{syscall.ECONNRESET, "connection_reset"},
	{syscall.EPIPE, "connection_reset"},
	{io.EOF, "io.EOF"},
	{io.ErrUnexpectedEOF, "io.EOF"},
	{redis.ErrNoScript, "NOSCRIPT"},
	{redis.ErrCrossSlot, "CROSSSLOT"},
}

// replies are Redis error replies, by go-redis's predicates (never by the
// error's text).
var replies = []struct {
	is   func(error) bool
	name string
}{
	{redis.IsLoadingError, "LOADING"},
	{redis.IsReadOnlyError, "READONLY"},
	{redis.IsMasterDownError, "MASTERDOWN"},
	{redis.IsNoReplicasError, "NOREPLICAS"},
	{redis.IsClusterDownError, "CLUSTERDOWN"},
	{redis.IsTryAgainError, "TRYAGAIN"},
	{func(err error) bool { _, ok := redis.IsMovedError(err); return ok }, "MOVED"},
	{func(err error) bool { _, ok := redis.IsAskError(err); return ok }, "ASK"},
	{redis.IsPermissionError, "NOPERM"},
	{redis.IsAuthError, "AUTH"},
	{redis.IsOOMError, "OOM"},
	{redis.IsMaxClientsError, "MAXCLIENTS"},
	{redis.IsExecAbortError, "EXECABORT"},
}

// ErrorType classifies an error for the error.type attribute: a short,
// low-cardinality name of its class, never its text, and "" for nil. The
// classes, in the order they are checked, are listed in the package
// documentation: redlease's sentinels first (by errors.Is), then timeouts,
// network and client failures, Redis error replies, a lost lock with none
// of these causes (redlease.ErrLost), and _OTHER.
func ErrorType(err error) string {
	if err == nil {
		return ""
	}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	var ne net.Error
	if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	for _, c := range causes {
		if errors.Is(err, c.err) {
			return c.name
		}
	}
	for _, r := range replies {
		if r.is(err) {
			return r.name
		}
	}
	var re redis.Error
	if errors.As(err, &re) && !errors.Is(err, redis.Nil) {
		return errorTypeRedisError
	}
	if errors.Is(err, redlease.ErrLost) {
		return "redlease.ErrLost"
	}
	return errorTypeOther
}

// Attribute keys of this package; error.type, server.address and
// server.port come from the semantic conventions.
const (
	keyStrategy  = attribute.Key("redlease.strategy")
	keyOperation = attribute.Key("redlease.operation")
	keyOutcome   = attribute.Key("redlease.outcome")
	keyEnded     = attribute.Key("redlease.ended")
	keyKey       = attribute.Key("redlease.key")
	keyNodeIndex = attribute.Key("redlease.node.index")
)

// nodeAttrs describes the node of ne: its index, and its address split
// into server.address and server.port where the client exposes one.
func nodeAttrs(ne *redlease.NodeError) []attribute.KeyValue {
	attrs := make([]attribute.KeyValue, 0, 4)
	attrs = append(attrs, keyNodeIndex.Int(ne.Node))
	if ne.Addr == "" {
		return attrs
	}
	host, port, err := net.SplitHostPort(ne.Addr)
	if err != nil {
		// No port: a Unix socket path, or a bare host.
		return append(attrs, semconv.ServerAddress(ne.Addr))
	}
	attrs = append(attrs, semconv.ServerAddress(host))
	if p, err := strconv.Atoi(port); err == nil {
		attrs = append(attrs, semconv.ServerPort(p))
	}
	return attrs
}
