package idempotency

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlease/redlease"
)

// Header fields of the middleware.
const (
	// HeaderIdempotencyKey is the request field that carries the client's
	// key (draft-ietf-httpapi-idempotency-key-header).
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderIdempotentReplayed is set to "true" on every response that was
	// not produced by running the handler now: a replayed response, and the
	// problem responses for a completed request whose response is not
	// available. A response of a handler that ran now never carries it.
	HeaderIdempotentReplayed = "Idempotent-Replayed"
)

// Middleware returns a net/http middleware that makes unsafe requests (POST,
// PATCH by default) carrying an Idempotency-Key take effect once, per the
// IETF draft "The Idempotency-Key HTTP Header Field", with b recording
// them. A nil b or an invalid option is an error (see below), found at
// start-up.
//
// For a covered method with a key (see ParseKey), the record is named by
// the principal, the method, the route and the key (Key), in a namespace
// of b's that is the middleware's own (see WithPrefix): no key given to
// b.Do or to a Consumer shares it. Without WithPrincipal keys are global,
// and two clients that pick the same key collide. The request is
// fingerprinted by its method, path and query, and body (PayloadHash), so
// that reusing a key for a different request is caught. The body is read
// (at most WithMaxBody) and handed to the handler intact.
//
//   - First request: the handler runs under b, once, with a buffering
//     ResponseWriter (the whole response is held in memory; streaming,
//     Flush and Hijack are not available to it); its status, its fields
//     (see below) and its body are recorded, then sent. FenceFrom gives it
//     the fence to pass to its own storage. A panic records nothing and
//     propagates.
//   - The handler's context: the request's values, but not its
//     cancellation. A client that disconnects (it timed out: the case the
//     key exists for) does not stop the handler; the run completes, is
//     recorded, and the client's retry gets its response. The context is
//     cancelled only if b's lock on the request is lost, or when
//     WithHandlerTimeout passes (default DefaultHandlerTimeout, 20 s,
//     shorter on a Barrier without a Keeper and with a short lease).
//   - A run whose context was cancelled: whatever the handler left (a
//     200 without a body, a 503, half a response) is neither recorded nor
//     sent; the client gets 503 "outcome-unknown" with Retry-After, since
//     the handler may have stopped before or after its effect. The record
//     is released, so a retry runs the handler again (with a higher
//     fence); reported to WithErrorLog.
//   - What is recorded: 2xx, 3xx and 4xx responses (a 4xx is the
//     request's definitive answer; 1xx interim responses are dropped),
//     except the transient statuses of WithTransientStatuses (by default
//     408, 425 and 429: "not now", not "no"), which are sent to their
//     client but not recorded, so a retry runs the handler again. A 5xx is
//     sent but not recorded either (see WithStoreServerErrors). Nor is a
//     409, whatever the options: it is the in-progress answer of a server
//     that honours Idempotency-Key (this one's, and a downstream's that
//     the handler relays, such as a payment provider still charging),
//     which recorded would hide the downstream's outcome for the
//     retention; any other 409 refuses the request (a conflict with the
//     resource's state, which a client may resolve and resubmit), so a
//     retry that runs the handler again causes no second effect. A status
//     that is not recorded is never recorded, whatever b's options say
//     (WithStoreEverything included): its key is released. A response
//     larger than b's WithMaxResult is sent, and the request only marked
//     done.
//   - Fields recorded with a response: Content-Type, Content-Encoding and
//     Content-Language (a body cannot be read without them), Vary and
//     Retry-After, always; then those of WithReplayHeaders (default
//     Location). With them, for each request field the response's Vary
//     names ("*" names none), a digest of the request's values of it
//     (field lines combined as RFC 9110 allows; absent differs from
//     empty; a digest, so that an Authorization or Cookie a Vary names is
//     not stored). Records written before Vary was recorded are replayed
//     as they were, as responses that vary on nothing.
//   - A response that could not be recorded (the store failed after the
//     handler ran, and b could not store it while it held the lock) is
//     sent all the same: the handler ran and its effect happened. It is
//     reported to WithErrorLog with an error that errors.Is
//     ErrNotRecorded. The lock on the request is kept until it runs out,
//     so a retry finds the request in progress (409) for up to b's lease,
//     and then runs the handler again as a takeover (with a higher fence;
//     at once, if the store lost the record itself): only the handler's
//     own storage, keyed by the request, can refuse a second effect then.
//   - Duplicate after completion: the recorded status, fields and body,
//     with Idempotent-Replayed: true. The handler does not run.
//   - Duplicate after completion whose request differs from the first in a
//     field the recorded response's Vary names (it accepts no gzip, or
//     another language): 409 "negotiation-mismatch", with
//     Idempotent-Replayed: true and without Retry-After. The recorded
//     bytes were negotiated for another request, and the handler must not
//     run again (its effect would repeat); the request completed, and the
//     same request with the first one's values of those fields gets the
//     replay. A 409, as for a response too large to keep: the request's
//     response exists but is not available to this request; not 406
//     (which a client may take for the request's own refusal) nor 422
//     (the key was not reused for another payload).
//   - Duplicate while the first runs: 409 with Retry-After (WithInFlightWait
//     lets it wait instead).
//   - Same key, different request: 422.
//   - Duplicate of a request whose response was too large to keep: 409
//     without Retry-After and with Idempotent-Replayed: true; the request
//     completed and will not run again, and a retry will not help. A 409
//     fits better than a 2xx, which would pretend to be the response.
//   - Missing key where required (WithRequired): 400. Malformed key: 400.
//     A keyed request whose principal (WithPrincipal) is empty: 401.
//     Body over the limit: 413; a body that cannot be read: 400.
//   - Store unreachable (network errors, timeouts, a loading or read-only
//     server): 503 with Retry-After, or the handler runs unprotected with
//     WithFailOpen (on a context its client's disconnect does not cancel,
//     bounded by WithHandlerTimeout).
//
// Error responses are RFC 9457 problem details (application/problem+json)
// with type "about:blank", the status phrase as title (as RFC 9457 asks
// for about:blank), a human-readable detail, and an extension member
// "code" that tells the cases apart: "missing-key", "invalid-key",
// "no-principal",
// "body-too-large", "unreadable-body", "in-progress", "key-reused" (422),
// "result-not-retained", "negotiation-mismatch" (409), "stored-failure" (500: a failure recorded in a
// Middleware's namespace by an earlier version of this package, whose
// Middleware on a Barrier with WithStoreEverything recorded the statuses
// it does not record; this one never records a failure), "store-unavailable",
// "outcome-unknown" (503: a run cancelled half-way), "internal".
//
// Requests with other methods, and requests without a key unless required,
// pass through untouched.
//
// A nil Barrier, an invalid option, or a missing principal (neither
// WithPrincipal nor WithGlobalKeys) is returned as an error that errors.Is
// redlease.ErrInvalid. The function it returns panics only on a nil
// handler, as net/http's Handle does.
func Middleware(b *Barrier, opts ...HTTPOption) (func(http.Handler) http.Handler, error) {
	if b == nil {
		return nil, redlease.Invalid("idempotency: nil Barrier")
	}
	cfg := defaultHTTPConfig()
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.applyHTTP(&cfg); err != nil {
			return nil, err
		}
	}
	switch {
	case cfg.principal == nil && !cfg.globalKeys:
		return nil, redlease.Invalid("idempotency: Middleware needs WithPrincipal (keys scoped to who sent them) or WithGlobalKeys (keys unique across all clients); without either, two clients that pick the same key read each other's responses")
	case cfg.principal != nil && cfg.globalKeys:
		return nil, redlease.Invalid("idempotency: WithPrincipal and WithGlobalKeys together: choose one")
	case cfg.globalKeys:
		cfg.principal = func(*http.Request) string { return "" }
	}
	cfg.replayHeaders = withRecordedHeaders(cfg.replayHeaders)
	if cfg.handlerTimeout == 0 {
		cfg.handlerTimeout = defaultHandlerTimeout(b)
	}
	cfg.runTimeout = cfg.wait + cfg.handlerTimeout
	if cfg.runTimeout < cfg.handlerTimeout { // overflowed
		cfg.runTimeout = math.MaxInt64
	}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic(redlease.Invalid("idempotency: nil handler"))
		}
		return &middleware{b: b, cfg: cfg, next: next}
	}, nil
}

// defaultHandlerTimeout is DefaultHandlerTimeout, or two thirds of b's
// lease if b has no Keeper and that is shorter (see WithHandlerTimeout).
func defaultHandlerTimeout(b *Barrier) time.Duration {
	if b.keeper == nil {
		return min(DefaultHandlerTimeout, b.lease*2/3)
	}
	return DefaultHandlerTimeout
}

type middleware struct {
	b    *Barrier
	cfg  httpConfig
	next http.Handler
}

// ServeHTTP applies the barrier to unsafe requests that carry a key.
func (m *middleware) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !m.cfg.methods[r.Method] {
		m.next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(HeaderIdempotencyKey)
	if len(values) == 0 {
		if m.cfg.required {
			writeProblem(w, http.StatusBadRequest, codeMissingKey, "this request requires an Idempotency-Key header field")
			return
		}
		m.next.ServeHTTP(w, r)
		return
	}
	key, err := m.key(values)
	if err != nil {
		writeProblem(w, http.StatusBadRequest, codeInvalidKey, err.Error())
		return
	}
	principal := m.cfg.principal(r)
	if principal == "" && !m.cfg.globalKeys {
		writeProblem(w, http.StatusUnauthorized, codeNoPrincipal, "an Idempotency-Key is scoped to who sends it, and this request names nobody")
		return
	}
	frame, bodyAt, err := m.readBody(w, r)
	if err != nil {
		writeBodyProblem(w, err)
		return
	}
	x := &exchange{m: m, r: r, body: frame[bodyAt:]}
	req := Request{
		Key:         Key("http", principal, r.Method, m.cfg.route(r), key),
		Fingerprint: PayloadHash(frame),
	}
	// The client's disconnect must not decide the record: a client that
	// timed out is the very case the key exists for, and its retry should
	// find the whole run's response. So the run ends only by the server's
	// deadline or the loss of the Barrier's lock.
	ctx, cancel := m.runContext(r, m.cfg.runTimeout)
	defer cancel()
	out, err := m.do(ctx, req, x.handle)
	var unrecorded *unrecordedStatus
	switch {
	case x.cancelled || errors.Is(err, ErrRunCancelled):
		// Whatever a cancelled handler left is not an answer: it may have
		// stopped before or after its effect. Nothing was recorded.
		m.cfg.errorLog(r, fmt.Errorf("idempotency: handler cancelled while it ran; outcome unknown, nothing recorded, a retry runs it again: %w", err))
		setRetryAfter(w, unavailableRetryAfter)
		writeProblem(w, http.StatusServiceUnavailable, codeOutcomeUnknown,
			"the request was interrupted; it may or may not have taken effect; retry it with the same Idempotency-Key")
	case x.resp != nil:
		// The handler ran now: its response is this client's, whatever
		// became of the record. A released status comes back as the error
		// handle returned; anything else means the record could not be
		// written.
		switch {
		case errors.Is(err, ErrNotRecorded): // first: it may wrap an unrecordedStatus b tried to store
			m.cfg.errorLog(r, fmt.Errorf("idempotency: response sent but not recorded; a retry gets 409 while the request's lock lasts, then runs the handler again: %w", err))
		case err == nil, errors.As(err, &unrecorded):
		default:
			m.cfg.errorLog(r, fmt.Errorf("idempotency: response sent but not recorded: %w", err))
		}
		x.resp.writeTo(w)
	case err == nil:
		m.replay(w, r, out.Result)
	default:
		m.fail(w, r, x, err)
	}
}

// errHandlerTimeout is the cause of a run's context when WithHandlerTimeout
// passed.
var errHandlerTimeout = errors.New("idempotency: handler timeout passed (WithHandlerTimeout)")

// runContext is the context a keyed request runs on: r's values, not its
// cancellation, and a deadline d from now.
func (m *middleware) runContext(r *http.Request, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(context.WithoutCancel(r.Context()), d, errHandlerTimeout)
}

// key parses the field: exactly one line of it.
func (m *middleware) key(values []string) (string, error) {
	if len(values) > 1 {
		return "", invalidKey("more than one Idempotency-Key field")
	}
	return parseKey(values[0], m.cfg.maxKeyLen)
}

func (m *middleware) do(ctx context.Context, req Request, h Handler) (Outcome, error) {
	return m.b.do(ctx, nsHTTP, req, h, m.cfg.wait)
}

// readBody reads the body after a length-prefixed method and request URI,
// so that the fingerprint input is built in one buffer, unambiguously.
// frame[bodyAt:] is the body.
func (m *middleware) readBody(w http.ResponseWriter, r *http.Request) (frame []byte, bodyAt int, err error) {
	if r.ContentLength > m.cfg.maxBody {
		return nil, 0, &http.MaxBytesError{Limit: m.cfg.maxBody}
	}
	var buf bytes.Buffer
	for _, f := range []string{r.Method, r.URL.RequestURI()} {
		var n [binary.MaxVarintLen64]byte
		buf.Write(n[:binary.PutUvarint(n[:], uint64(len(f)))])
		buf.WriteString(f)
	}
	bodyAt = buf.Len()
	if r.Body != nil {
		if _, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, m.cfg.maxBody)); err != nil {
			return nil, 0, err
		}
	}
	return buf.Bytes(), bodyAt, nil
}

// replay sends a recorded response.
func (m *middleware) replay(w http.ResponseWriter, r *http.Request, result []byte) {
	resp, err := decodeResponse(result)
	if err != nil {
		m.cfg.errorLog(r, err)
		writeProblem(w, http.StatusInternalServerError, codeInternal, "the recorded response for this Idempotency-Key could not be read")
		return
	}
	if differ := resp.varyMismatch(r); len(differ) > 0 {
		// The recorded bytes were negotiated for another request (gzip
		// for a client that did not ask for it). Running the handler
		// again would repeat its effect; so the client is told its
		// request completed, and how to get its response.
		w.Header().Set(HeaderIdempotentReplayed, "true")
		writeProblem(w, http.StatusConflict, codeNegotiation,
			"the request with this Idempotency-Key completed, but its response was negotiated for other values of "+
				strings.Join(differ, ", ")+"; send them as the first request did to get it")
		return
	}
	h := w.Header()
	for k, v := range resp.header {
		h[k] = v
	}
	h.Set(HeaderIdempotentReplayed, "true")
	w.WriteHeader(resp.status)
	_, _ = w.Write(resp.body)
}

// fail answers a request whose handler did not run now.
func (m *middleware) fail(w http.ResponseWriter, r *http.Request, x *exchange, err error) {
	var stored *StoredError
	switch {
	case errors.Is(err, ErrMismatch):
		writeProblem(w, http.StatusUnprocessableEntity, codeKeyReused,
			"this Idempotency-Key was already used for a different request")
	case errors.Is(err, ErrInProgress):
		setRetryAfter(w, inProgressRetryAfter(err))
		writeProblem(w, http.StatusConflict, codeInProgress,
			"a request with this Idempotency-Key is being processed; retry later")
	case errors.Is(err, ErrResultNotStored):
		w.Header().Set(HeaderIdempotentReplayed, "true")
		writeProblem(w, http.StatusConflict, codeResultNotRetained,
			"the request with this Idempotency-Key completed, but its response was too large to retain")
	case errors.As(err, &stored):
		w.Header().Set(HeaderIdempotentReplayed, "true")
		writeProblem(w, http.StatusInternalServerError, codeStoredFailure,
			"the request with this Idempotency-Key failed, and its failure was recorded")
	case storeUnavailable(err):
		m.unavailable(w, r, x, err)
	default:
		m.cfg.errorLog(r, err)
		writeProblem(w, http.StatusInternalServerError, codeInternal, "the idempotency record could not be processed")
	}
}

// unavailable answers a request whose record could not be read or written:
// fail closed, or run the handler unprotected.
func (m *middleware) unavailable(w http.ResponseWriter, r *http.Request, x *exchange, err error) {
	m.cfg.errorLog(r, fmt.Errorf("idempotency: store unavailable (fail open: %v): %w", m.cfg.failOpen, err))
	// A request whose client is gone gets nothing run for it. One that
	// runs gets the whole handler timeout, and, as a protected run, is not
	// cancelled if its client leaves.
	if m.cfg.failOpen && r.Context().Err() == nil {
		ctx, cancel := m.runContext(r, m.cfg.handlerTimeout)
		defer cancel()
		m.next.ServeHTTP(w, x.request(ctx))
		return
	}
	setRetryAfter(w, unavailableRetryAfter)
	writeProblem(w, http.StatusServiceUnavailable, codeStoreUnavailable,
		"requests with an Idempotency-Key cannot be processed right now; retry later")
}

// storeUnavailable tells a store that cannot answer now (a retry may
// succeed) from other failures: network errors and timeouts, a connection
// pool with no connection to give, and servers that refuse work for a
// while (loading, read-only after a failover, cluster down, too many
// clients).
func storeUnavailable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.Is(err, redis.ErrPoolExhausted) ||
		errors.Is(err, redlease.ErrUnavailable) ||
		redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsClusterDownError(err) ||
		redis.IsTryAgainError(err) || redis.IsMasterDownError(err) || redis.IsMaxClientsError(err)
}

// fenceKey is the context key of FenceFrom.
type fenceKey struct{}

// FenceFrom returns the fence the Barrier gave the handler of the request
// whose context ctx is (see Outcome.Fence): pass it to any storage the
// handler writes to, so that a handler that outlived its lock is refused
// there. ok is false outside the middleware's handler, and when the
// handler runs unprotected (WithFailOpen with the store down).
func FenceFrom(ctx context.Context) (fence uint64, ok bool) {
	fence, ok = ctx.Value(fenceKey{}).(uint64)
	return fence, ok
}
