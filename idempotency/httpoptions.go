package idempotency

import (
	"net/http"
	"slices"
	"time"

	"github.com/redlease/redlease"
)

// The options of Middleware, their defaults, and the response fields
// every record keeps.

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
// is garbage to its client), Vary, which says what the representation was
// negotiated by (a replay is refused to a request that differs there: see
// Middleware), and Retry-After, which is part of the answer wherever a
// handler sent it.
var recordedHeaders = [...]string{"Content-Type", "Content-Encoding", "Content-Language", "Vary", "Retry-After"}

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
// Content-Language, which a body cannot be read without, Vary, and
// Retry-After. Default Location (and those five). Other fields the handler set reach the
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
// is not recorded either way. The Barrier's WithStoreEverything does not
// change any of this.
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
// every 4xx but 409 is recorded (a 409 never is: see Middleware). 5xx are not recorded unless WithStoreServerErrors,
// and a 5xx listed here is not recorded even then. A status listed here is
// not recorded on a Barrier with WithStoreEverything either.
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
