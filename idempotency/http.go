package idempotency

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"slices"
	"strconv"
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

// Defaults of the middleware's bounds.
const (
	// DefaultMaxKeyLength bounds an Idempotency-Key, in characters (keys
	// are ASCII, so also in bytes). Long enough for any UUID, ULID or
	// hash-based key.
	DefaultMaxKeyLength = 255
	// DefaultMaxBody bounds the request body the middleware reads to
	// fingerprint a request: 1 MiB.
	DefaultMaxBody = 1 << 20
	// DefaultHandlerTimeout bounds a keyed request's run on the server side
	// (see WithHandlerTimeout): 20 s. Long enough for a handler that calls a
	// payment provider, and longer than most clients wait, so that a
	// client's retry after its own timeout finds the recorded response;
	// two thirds of DefaultLease, so that a handler on a Barrier without a
	// Keeper is stopped while its lock is still held, with a third of the
	// lease left to record its response; and within the 30 s a server
	// commonly gets to drain its requests on shutdown (Kubernetes's
	// default grace period).
	DefaultHandlerTimeout = 20 * time.Second
)

// ErrInvalidKey is the error of ParseKey (wrapped with the reason): the
// Idempotency-Key field is not a key the middleware accepts. Responses for
// it are 400.
var ErrInvalidKey = errors.New("idempotency: invalid Idempotency-Key")

// ParseKey parses an Idempotency-Key field value and returns the key. It
// never panics, and what it accepts is non-empty, not blank, at most
// DefaultMaxKeyLength characters, and printable ASCII (0x20-0x7E) only;
// everything else is an error that errors.Is ErrInvalidKey.
//
// The draft defines the field as an RFC 8941 Item whose value is a String:
// a double-quoted value in which only \" and \\ are escapes. ParseKey
// parses exactly that, and round-trips: quoting an accepted key as an
// sf-string (escaping " and \) and parsing it again gives the same key.
//
// Many clients send the key bare (Idempotency-Key: 8e03978e-40d5-...), so
// an unquoted value is accepted too, as the key itself, if it consists of
// visible ASCII characters other than DQUOTE, backslash, comma and
// semicolon: those would make it ambiguous with sf-string, list and
// parameter syntax, and spaces are not allowed unquoted. RFC 8941
// parameters ("key";a=1) are rejected rather than ignored: the draft
// defines none, and two requests that differ only in ignored parameters
// would silently share a record. Leading and trailing spaces and tabs
// (HTTP's optional whitespace) are ignored.
func ParseKey(header string) (string, error) {
	return parseKey(header, DefaultMaxKeyLength)
}

func parseKey(header string, maxLen int) (string, error) {
	s := strings.Trim(header, " \t")
	if s == "" {
		return "", invalidKey("empty")
	}
	var key string
	var err error
	if s[0] == '"' {
		key, err = parseSFString(s, maxLen)
	} else {
		key, err = parsePlainKey(s, maxLen)
	}
	if err != nil {
		return "", err
	}
	if strings.Trim(key, " ") == "" {
		return "", invalidKey("blank")
	}
	return key, nil
}

// parseSFString parses s, which starts with DQUOTE, as an RFC 8941 String
// that must end s (RFC 8941 section 4.2.5).
func parseSFString(s string, maxLen int) (string, error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			i++
			if i == len(s) || (s[i] != '"' && s[i] != '\\') {
				return "", invalidKey("a backslash may only escape \" or \\")
			}
			c = s[i]
		case c == '"':
			if i != len(s)-1 {
				return "", invalidKey("characters after the closing quote (parameters and lists are not accepted)")
			}
			if b.Len() == 0 {
				return "", invalidKey("empty")
			}
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", invalidKey("only printable ASCII characters are allowed")
		}
		if b.Len() == maxLen {
			return "", invalidKey(fmt.Sprintf("longer than %d characters", maxLen))
		}
		b.WriteByte(c)
	}
	return "", invalidKey("missing closing quote")
}

// parsePlainKey accepts an unquoted key (see ParseKey).
func parsePlainKey(s string, maxLen int) (string, error) {
	if len(s) > maxLen {
		return "", invalidKey(fmt.Sprintf("longer than %d characters", maxLen))
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c <= 0x20 || c > 0x7e:
			return "", invalidKey("only visible ASCII characters are allowed in an unquoted key; quote it to use spaces")
		case c == '"' || c == '\\' || c == ',' || c == ';':
			return "", invalidKey(fmt.Sprintf("%q is not allowed in an unquoted key", c))
		}
	}
	return s, nil
}

func invalidKey(reason string) error { return fmt.Errorf("%w: %s", ErrInvalidKey, reason) }

// HTTPOption configures Middleware.
type HTTPOption interface {
	applyHTTP(*httpConfig) error
}

type httpOptionFunc func(*httpConfig) error

func (f httpOptionFunc) applyHTTP(c *httpConfig) error { return f(c) }

type httpConfig struct {
	methods           map[string]bool
	required          bool
	principal         func(*http.Request) string // nil: WithGlobalKeys or not configured
	globalKeys        bool
	route             func(*http.Request) string
	maxBody           int64
	maxKeyLen         int
	replayHeaders     []string
	failOpen          bool
	wait              time.Duration
	storeServerErrors bool
	transient         map[int]bool
	handlerTimeout    time.Duration // 0: not set, derived from the Barrier
	runTimeout        time.Duration // wait + handlerTimeout: a keyed request's deadline
	errorLog          func(*http.Request, error)
}

func defaultHTTPConfig() httpConfig {
	return httpConfig{
		methods:       map[string]bool{http.MethodPost: true, http.MethodPatch: true},
		route:         func(r *http.Request) string { return r.URL.Path },
		maxBody:       DefaultMaxBody,
		maxKeyLen:     DefaultMaxKeyLength,
		replayHeaders: []string{"Location"},
		transient: map[int]bool{
			http.StatusRequestTimeout:  true,
			http.StatusTooEarly:        true,
			http.StatusTooManyRequests: true,
		},
		errorLog: func(*http.Request, error) {},
	}
}

// recordedHeaders are stored and replayed with every recorded response,
// whatever WithReplayHeaders says: the representation fields, without
// which the body cannot be read (a gzip body without its Content-Encoding
// is garbage to its client), and Retry-After, which is part of the answer
// wherever a handler sent it.
var recordedHeaders = [...]string{"Content-Type", "Content-Encoding", "Content-Language", "Retry-After"}

// withRecordedHeaders returns recordedHeaders followed by the names not
// among them, each once.
func withRecordedHeaders(names []string) []string {
	out := append(make([]string, 0, len(recordedHeaders)+len(names)), recordedHeaders[:]...)
	for _, n := range names {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// WithMethods sets the methods the middleware covers; requests with other
// methods pass through untouched, key or not. Default POST and PATCH, the
// non-idempotent methods of the draft. Methods are case-sensitive.
func WithMethods(methods ...string) HTTPOption {
	return httpOptionFunc(func(c *httpConfig) error {
		if len(methods) == 0 {
			return redlease.Invalid("idempotency: no methods")
		}
		c.methods = make(map[string]bool, len(methods))
		for _, m := range methods {
			if m == "" {
				return redlease.Invalid("idempotency: empty method")
			}
			c.methods[m] = true
		}
		return nil
	})
}

// WithRequired makes the Idempotency-Key field mandatory on covered
// methods: a request without one gets 400. Default false: a request
// without a key passes through untouched (and is not protected).
func WithRequired(required bool) HTTPOption {
	return httpOptionFunc(func(c *httpConfig) error {
		c.required = required
		return nil
	})
}

// WithPrincipal names who sends a request (a user or API client id, from
// the authenticated request), so that keys are scoped per principal: two
// clients that pick the same key get their own records, never each other's
// responses. Middleware requires it, or WithGlobalKeys. Make sure it runs
// after authentication. A keyed request whose principal is empty is
// refused (401, code "no-principal"): an unauthenticated request must not
// share a key space with others.
func WithPrincipal(principal func(*http.Request) string) HTTPOption {
	return httpOptionFunc(func(c *httpConfig) error {
		if principal == nil {
			return redlease.Invalid("idempotency: nil principal func")
		}
		c.principal = principal
		return nil
	})
}

// WithGlobalKeys declares that idempotency keys are unique across every
// client (generated by the server, or UUIDs from trusted callers), so that
// the Middleware needs no principal: whoever sends a key gets its stored
// response. Without it, Middleware requires WithPrincipal, because two
// clients that pick the same key would otherwise read each other's
// responses (status, headers, body). It cannot be combined with
// WithPrincipal.
func WithGlobalKeys() HTTPOption {
	return httpOptionFunc(func(c *httpConfig) error {
		c.globalKeys = true
		return nil
	})
}

// WithRoute names the operation a request is for (a route pattern such as
// "POST /orders", r.Pattern on a ServeMux), part of the record's key.
// Default r.URL.Path.
func WithRoute(route func(*http.Request) string) HTTPOption {
	return httpOptionFunc(func(c *httpConfig) error {
		if route == nil {
			return redlease.Invalid("idempotency: nil route func")
		}
		c.route = route
		return nil
	})
}

// WithMaxBody bounds the request body, in bytes, read to fingerprint a
// keyed request; a larger one gets 413 and the handler does not run.
// Default DefaultMaxBody (1 MiB).
func WithMaxBody(n int64) HTTPOption {
	return httpOptionFunc(func(c *httpConfig) error {
		if n < 1 {
			return redlease.Invalid("idempotency: max body %d: must be positive", n)
		}
		c.maxBody = n
		return nil
	})
}

// WithMaxKeyLength bounds the Idempotency-Key, in characters; a longer one
// gets 400. Default DefaultMaxKeyLength (255).
func WithMaxKeyLength(n int) HTTPOption {
	return httpOptionFunc(func(c *httpConfig) error {
		if n < 1 {
			return redlease.Invalid("idempotency: max key length %d: must be positive", n)
		}
		c.maxKeyLen = n
		return nil
	})
}

// WithReplayHeaders sets the response header fields stored with a response
// and replayed with it (all their values), besides those that always are:
// the representation fields Content-Type, Content-Encoding and
// Content-Language, which a body cannot be read without, and Retry-After.
// Default Location (and those four). Other fields the handler set reach the
// first client only; fields that vary per response (Date, request ids) or
// carry secrets (Set-Cookie) should not be replayed.
func WithReplayHeaders(names ...string) HTTPOption {
	return httpOptionFunc(func(c *httpConfig) error {
		c.replayHeaders = make([]string, 0, len(names))
		for _, n := range names {
			if n == "" {
				return redlease.Invalid("idempotency: empty header name")
			}
			c.replayHeaders = append(c.replayHeaders, http.CanonicalHeaderKey(n))
		}
		return nil
	})
}

// WithFailOpen decides what a keyed request gets when the store cannot be
// reached. Default false (fail closed): 503 with Retry-After, and the
// handler does not run. With true (fail open) the handler runs without
// idempotency: nothing is recorded and nothing is checked, so a retry
// during the outage, or one after it, runs the handler again. Choose it
// only where a duplicate effect is cheaper than an outage.
func WithFailOpen(failOpen bool) HTTPOption {
	return httpOptionFunc(func(c *httpConfig) error {
		c.failOpen = failOpen
		return nil
	})
}

// WithInFlightWait makes a duplicate that arrives while the first request
// is running wait up to d for it to complete, and get its response, before
// falling back to 409. Default 0: 409 at once, as the draft describes.
func WithInFlightWait(d time.Duration) HTTPOption {
	return httpOptionFunc(func(c *httpConfig) error {
		if d < 0 {
			return redlease.Invalid("idempotency: in-flight wait %v: must not be negative", d)
		}
		c.wait = d
		return nil
	})
}

// WithStoreServerErrors stores 5xx responses and replays them like any
// other. Default false: a 5xx is treated as transient, returned to its
// client but not recorded, so that a retry with the same key runs the
// handler again. Use it only for handlers whose 5xx may follow a side
// effect that must not be repeated. A 5xx listed in WithTransientStatuses
// is not recorded either way.
func WithStoreServerErrors(store bool) HTTPOption {
	return httpOptionFunc(func(c *httpConfig) error {
		c.storeServerErrors = store
		return nil
	})
}

// WithTransientStatuses sets the statuses that say "not now" rather than
// "no": a response with one of them is sent to its client but not
// recorded, so a retry with the same key runs the handler again. Default
// 408 (Request Timeout), 425 (Too Early) and 429 (Too Many Requests);
// were it recorded, a 429 would be replayed for the whole retention, and
// the request it refused would never run. Codes must be 400-599; with none,
// every 4xx is recorded. 5xx are not recorded unless WithStoreServerErrors,
// and a 5xx listed here is not recorded even then.
func WithTransientStatuses(codes ...int) HTTPOption {
	return httpOptionFunc(func(c *httpConfig) error {
		c.transient = make(map[int]bool, len(codes))
		for _, code := range codes {
			if code < 400 || code > 599 {
				return redlease.Invalid("idempotency: transient status %d: must be 400-599 (a 1xx, 2xx or 3xx is an answer)", code)
			}
			c.transient[code] = true
		}
		return nil
	})
}

// WithHandlerTimeout bounds, on the server side, how long a keyed request
// may run: its deadline, d after the middleware has read its body (plus
// WithInFlightWait, if set), bounds the store calls before the handler and
// the handler itself. A response the handler returned in time is then
// recorded whatever the deadline (the Barrier tries for up to its lease).
// When the deadline passes while the handler runs, its context is
// cancelled, nothing is recorded, and the client (if still there) gets 503
// "outcome-unknown". The client's disconnect does not cancel the handler:
// a client that times out is the case Idempotency-Keys exist for, and its
// retry should find the complete run's response, not a run cut off
// half-way.
//
// Default DefaultHandlerTimeout (20 s), or, if the Middleware's Barrier
// has no Keeper, two thirds of its lease when that is shorter: without a
// Keeper the lock lasts one lease, and a run should end while its lock is
// held, with time left to record its response. An explicit d is used as given; without a
// Keeper the end of the lease cancels the run too, so keep d below it or
// give the Barrier a Keeper. Make the handler's own outgoing calls (a payment
// provider) time out well before d, so that the handler, not the
// deadline, decides its answer.
func WithHandlerTimeout(d time.Duration) HTTPOption {
	return httpOptionFunc(func(c *httpConfig) error {
		if d <= 0 {
			return redlease.Invalid("idempotency: handler timeout %v: must be positive", d)
		}
		c.handlerTimeout = d
		return nil
	})
}

// WithErrorLog receives the failures a response does not reveal to the
// operator: the store unreachable (with fail-open, a request that ran
// unprotected), a handler's response that could not be recorded
// (ErrNotRecorded), a run cancelled half-way by the handler timeout or the
// loss of its lock (ErrRunCancelled), an unreadable record. Default: none.
// It must be safe for concurrent use.
func WithErrorLog(log func(r *http.Request, err error)) HTTPOption {
	return httpOptionFunc(func(c *httpConfig) error {
		if log == nil {
			return redlease.Invalid("idempotency: nil error log func")
		}
		c.errorLog = log
		return nil
	})
}

// Middleware returns a net/http middleware that makes unsafe requests (POST,
// PATCH by default) carrying an Idempotency-Key take effect once, per the
// IETF draft "The Idempotency-Key HTTP Header Field", with b recording
// them. It panics on a nil b or an invalid option: a programming error,
// found at start-up.
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
//     sent but not recorded either (see WithStoreServerErrors). A response
//     larger than b's WithMaxResult is sent, and the request only marked
//     done.
//   - Fields recorded with a response: Content-Type, Content-Encoding and
//     Content-Language (a body cannot be read without them) and
//     Retry-After, always; then those of WithReplayHeaders (default
//     Location).
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
// "result-not-retained", "stored-failure" (a failure recorded by a Barrier
// with WithStoreEverything, replayed as 500), "store-unavailable",
// "outcome-unknown" (503: a run cancelled half-way), "internal".
//
// Requests with other methods, and requests without a key unless required,
// pass through untouched.
//
// Middleware panics where NewMiddleware returns an error: a nil Barrier, an
// invalid option, or neither WithPrincipal nor WithGlobalKeys.
func Middleware(b *Barrier, opts ...HTTPOption) func(http.Handler) http.Handler {
	mw, err := NewMiddleware(b, opts...)
	if err != nil {
		panic(err)
	}
	return mw
}

// NewMiddleware is Middleware, reporting a nil Barrier, an invalid option
// or a missing principal (neither WithPrincipal nor WithGlobalKeys) as an
// error that errors.Is redlease.ErrInvalid. The function it returns panics
// only on a nil handler.
func NewMiddleware(b *Barrier, opts ...HTTPOption) (func(http.Handler) http.Handler, error) {
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

// Problem codes (the "code" member of problem responses).
const (
	codeMissingKey        = "missing-key"
	codeNoPrincipal       = "no-principal"
	codeInvalidKey        = "invalid-key"
	codeBodyTooLarge      = "body-too-large"
	codeUnreadableBody    = "unreadable-body"
	codeInProgress        = "in-progress"
	codeKeyReused         = "key-reused"
	codeResultNotRetained = "result-not-retained"
	codeStoredFailure     = "stored-failure"
	codeStoreUnavailable  = "store-unavailable"
	codeOutcomeUnknown    = "outcome-unknown"
	codeInternal          = "internal"
)

// Retry-After bounds. The Barrier's hint for a request in flight can be as
// long as the record's TTL; a client should look again well before that.
const (
	unavailableRetryAfter = time.Second
	maxRetryAfter         = time.Minute
)

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

func writeBodyProblem(w http.ResponseWriter, err error) {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeProblem(w, http.StatusRequestEntityTooLarge, codeBodyTooLarge,
			fmt.Sprintf("a request with an Idempotency-Key may carry at most %d bytes", tooLarge.Limit))
		return
	}
	writeProblem(w, http.StatusBadRequest, codeUnreadableBody, "the request body could not be read")
}

// replay sends a recorded response.
func (m *middleware) replay(w http.ResponseWriter, r *http.Request, result []byte) {
	resp, err := decodeResponse(result)
	if err != nil {
		m.cfg.errorLog(r, err)
		writeProblem(w, http.StatusInternalServerError, codeInternal, "the recorded response for this Idempotency-Key could not be read")
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

func inProgressRetryAfter(err error) time.Duration {
	var ip *InProgressError
	if errors.As(err, &ip) {
		return ip.RetryAfter
	}
	return time.Second
}

// setRetryAfter sets Retry-After in whole seconds, rounded up, within
// [1 s, maxRetryAfter].
func setRetryAfter(w http.ResponseWriter, d time.Duration) {
	d = min(max(d, time.Second), maxRetryAfter)
	secs := (d + time.Second - 1) / time.Second
	w.Header().Set("Retry-After", strconv.FormatInt(int64(secs), 10))
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

// problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

func writeProblem(w http.ResponseWriter, status int, code, detail string) {
	body, err := json.Marshal(problem{Type: "about:blank", Title: statusPhrase(status), Status: status, Detail: detail, Code: code})
	if err != nil { // cannot happen: every field is a string or an int
		body = []byte(`{"type":"about:blank"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// statusPhrase is the RFC 9110 phrase, where Go still has the older one.
func statusPhrase(status int) string {
	switch status {
	case http.StatusRequestEntityTooLarge:
		return "Content Too Large"
	case http.StatusUnprocessableEntity:
		return "Unprocessable Content"
	}
	return http.StatusText(status)
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

// exchange is one keyed request: its body, and the response of its
// handler if the handler ran now.
type exchange struct {
	m         *middleware
	r         *http.Request
	body      []byte
	resp      *bufferedResponse
	cancelled bool // the handler's context had ended when it returned
}

// request is a shallow copy of the request with its body restored, so the
// caller's request is left as it was.
func (x *exchange) request(ctx context.Context) *http.Request {
	r := x.r.WithContext(ctx)
	r.Body = io.NopCloser(bytes.NewReader(x.body))
	return r
}

// handle is the Barrier handler: it runs the HTTP handler and returns its
// encoded response, or a non-Final error so that the record is released:
// for a status that is not recorded (a 5xx, a transient status), and for a
// run whose context ended (the Barrier refuses to record those too).
func (x *exchange) handle(ctx context.Context, fence uint64) ([]byte, error) {
	resp := &bufferedResponse{header: make(http.Header)}
	x.m.next.ServeHTTP(resp, x.request(context.WithValue(ctx, fenceKey{}, fence)))
	resp.finish()
	x.resp = resp
	if err := ctx.Err(); err != nil {
		x.cancelled = true
		return nil, fmt.Errorf("idempotency: the handler's context ended while it ran: %w (%w)", err, context.Cause(ctx))
	}
	if x.m.unrecorded(resp.status) {
		return nil, &unrecordedStatus{status: resp.status}
	}
	return encodeResponse(resp, x.m.cfg.replayHeaders), nil
}

// unrecorded reports whether a response with status is sent but not
// recorded: a 5xx unless WithStoreServerErrors, a transient status.
func (m *middleware) unrecorded(status int) bool {
	return m.cfg.transient[status] || (status >= 500 && !m.cfg.storeServerErrors)
}

// unrecordedStatus is a handler's response with a status that is not
// recorded (a 5xx, a transient status): the request is released.
type unrecordedStatus struct{ status int }

// Error names the status that released the request.
func (e *unrecordedStatus) Error() string {
	return fmt.Sprintf("idempotency: handler answered %d; not recorded", e.status)
}

// bufferedResponse is the ResponseWriter a recorded handler writes to. It
// keeps net/http's semantics that matter for a recording: the first
// WriteHeader wins, a Write without one means 200, and header changes
// after WriteHeader have no effect.
type bufferedResponse struct {
	header http.Header // what the handler manipulates
	sent   http.Header // header as of WriteHeader
	status int
	body   bytes.Buffer
}

// Header, WriteHeader and Write buffer the response (http.ResponseWriter).
func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code)) // as net/http does
	}
	// 1xx responses are informational; sent after the handler is done they
	// would inform nobody.
	if b.status != 0 || code < 200 {
		return
	}
	b.status = code
	b.sent = b.header.Clone()
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	b.finish()
	return b.body.Write(p)
}

// finish makes a handler that wrote nothing a 200, as net/http does.
func (b *bufferedResponse) finish() {
	if b.status == 0 {
		b.WriteHeader(http.StatusOK)
	}
}

// writeTo sends the response, on top of the fields outer handlers set.
func (b *bufferedResponse) writeTo(w http.ResponseWriter) {
	h := w.Header()
	for k, v := range b.sent {
		h[k] = v
	}
	w.WriteHeader(b.status)
	_, _ = w.Write(b.body.Bytes())
}

// A recorded response is compact binary, since bodies are often not text
// and the Barrier bounds results in bytes:
//
//	version byte (1)
//	status uvarint
//	n uvarint, then n × (name, value), each a uvarint length and bytes
//	body (the rest)
const responseVersion = 1

// storedResponse is a decoded recorded response.
type storedResponse struct {
	status int
	header http.Header
	body   []byte
}

func encodeResponse(b *bufferedResponse, names []string) []byte {
	var fields []string
	for _, name := range names {
		for _, v := range b.sent[name] {
			fields = append(fields, name, v)
		}
	}
	out := make([]byte, 0, 16+len(fields)*16+b.body.Len())
	out = append(out, responseVersion)
	out = binary.AppendUvarint(out, uint64(b.status))
	out = binary.AppendUvarint(out, uint64(len(fields)/2))
	for _, f := range fields {
		out = binary.AppendUvarint(out, uint64(len(f)))
		out = append(out, f...)
	}
	return append(out, b.body.Bytes()...)
}

var errBadRecord = errors.New("idempotency: recorded response is not one the middleware wrote")

func decodeResponse(rec []byte) (storedResponse, error) {
	if len(rec) == 0 || rec[0] != responseVersion {
		return storedResponse{}, errBadRecord
	}
	d := decoder{rest: rec[1:]}
	status := d.uvarint()
	n := d.uvarint()
	if d.bad || status < 100 || status > 999 || n > uint64(len(d.rest)) {
		return storedResponse{}, errBadRecord
	}
	h := make(http.Header, n)
	for range n {
		name, value := d.string(), d.string()
		h[name] = append(h[name], value)
	}
	if d.bad {
		return storedResponse{}, errBadRecord
	}
	return storedResponse{status: int(status), header: h, body: d.rest}, nil
}

// decoder reads a recorded response; bad sticks once a read fails.
type decoder struct {
	rest []byte
	bad  bool
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.rest)
	if n <= 0 {
		d.bad = true
		return 0
	}
	d.rest = d.rest[n:]
	return v
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.bad || n > uint64(len(d.rest)) {
		d.bad = true
		return ""
	}
	s := string(d.rest[:n])
	d.rest = d.rest[n:]
	return s
}
