package idempotency_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
)

// Helpers for tests on the wire: a real listener, real clients with their
// own timeouts, and no goroutine of ours left behind.

// wireNoLeaks checks, when the test ends, that it left no goroutine behind.
// Call it first, so that its check runs after every other cleanup.
func wireNoLeaks(t *testing.T) {
	t.Helper()
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) })
}

// serve runs h behind a real listener until the test ends (Close waits
// for the handlers still running).
func wireServe(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts
}

// wireClient is a real client with a transport of its own, which gives up
// on a request after timeout.
func wireClient(t *testing.T, timeout time.Duration) *http.Client {
	t.Helper()
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: timeout}
}

// wireReply is what a client got: the response and its whole body, or the
// error that ended the exchange.
type wireReply struct {
	resp *http.Response
	body []byte
	err  error
}

// post sends a POST with an Idempotency-Key and reads the whole answer.
// Safe to call from any goroutine: it reports errors, it does not fail the
// test.
func wirePost(ctx context.Context, c *http.Client, url, key, body string) wireReply {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return wireReply{err: err}
	}
	req.Header.Set(idempotency.HeaderIdempotencyKey, key)
	resp, err := c.Do(req)
	if err != nil {
		return wireReply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return wireReply{resp: resp, body: b, err: err}
}

// wireLatch is a channel a test opens once to let handlers go on. Opening it
// again is harmless, so a cleanup opens it whatever happened, and no
// handler is left waiting when the server closes.
type wireLatch struct {
	ch   chan struct{}
	once sync.Once
}

// newWireLatch returns a latch, not open yet. Create it before the server
// whose handlers wait on it, and register its open as a cleanup after
// wireServe (t.Cleanup(l.open)), so that it runs before the server's Close.
func newWireLatch() *wireLatch { return &wireLatch{ch: make(chan struct{})} }

func (l *wireLatch) open() { l.once.Do(func() { close(l.ch) }) }

// wait waits until the latch is open, ctx ends or d passes, whichever is
// first, and reports whether the latch opened.
func (l *wireLatch) wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-l.ch:
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

// wireReceive waits for a value from ch, failing the test without it
// within d plus 3 × what a probe measured this process stalled meanwhile
// (redistest.Await).
func wireReceive[T any](t *testing.T, ch <-chan T, d time.Duration, what string) T {
	t.Helper()
	probe := redistest.StartStallProbe(t)
	defer probe.Stop()
	return redistest.Await(t, probe, ch, d, 3, "%s: nothing arrived", what)
}
