package idempotency

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
)

// Response capture: the handler of a keyed request runs into a buffer,
// so that its response can be recorded before it is sent.

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
// for a status that is not recorded (a 409, a transient status, a 5xx),
// and for a run whose context ended (the Barrier refuses to record those
// too).
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
	return encodeResponse(resp, x.m.cfg.replayHeaders, x.r), nil
}

// unrecorded reports whether a response with status is sent but not
// recorded: a 409, a transient status, a 5xx unless WithStoreServerErrors.
//
// Every 409, whatever the options: a 409 is what a server that honours
// Idempotency-Key answers while a request with that key is in progress
// (the IETF draft's answer, with or without Retry-After), and a handler
// that relays a downstream's (a payment provider's) cannot tell it from
// any other conflict. Recorded, it would be replayed for the retention
// while the downstream's run completes unreported. Any other 409 refuses
// the request ("a conflict with the current state of the target
// resource", which RFC 9110 expects a client may resolve and resubmit):
// nothing took effect, so running the handler again for a retry costs a
// second look, never a second effect.
func (m *middleware) unrecorded(status int) bool {
	return status == http.StatusConflict || m.cfg.transient[status] || (status >= 500 && !m.cfg.storeServerErrors)
}

// unrecordedStatus is a handler's response with a status that is not
// recorded (a 409, a transient status, a 5xx): the request is released,
// whatever the Barrier's WithStoreEverything says (see Barrier.keep).
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
