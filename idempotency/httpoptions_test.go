package idempotency

import (
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
)

// httpFakeKeeper is a Keeper that keeps nothing: only its presence matters.
type httpFakeKeeper struct{}

func (httpFakeKeeper) Keep(*redlease.Lock) (stop func()) { return func() {} }

func TestDefaultHandlerTimeout(t *testing.T) {
	// The client is never used: no connection is made.
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	for _, tc := range []struct {
		name string
		opts []Option
		want time.Duration
	}{
		{"default lease", nil, 20 * time.Second},
		{"short lease", []Option{WithLease(900 * time.Millisecond)}, 600 * time.Millisecond},
		{"long lease", []Option{WithLease(time.Minute)}, DefaultHandlerTimeout},
		{"short lease, kept", []Option{WithLease(900 * time.Millisecond), WithKeeper(httpFakeKeeper{})}, DefaultHandlerTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(c, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			mw, err := Middleware(b, WithGlobalKeys())
			if err != nil {
				t.Fatal(err)
			}
			m := mw(http.NotFoundHandler()).(*middleware)
			if got := m.cfg.handlerTimeout; got != tc.want {
				t.Errorf("default: got %v, want %v", got, tc.want)
			}
			if mw, err = Middleware(b, WithGlobalKeys(), WithHandlerTimeout(time.Hour)); err != nil {
				t.Fatal(err)
			}
			m = mw(http.NotFoundHandler()).(*middleware)
			if got := m.cfg.handlerTimeout; got != time.Hour {
				t.Errorf("explicit: got %v, want %v", got, time.Hour)
			}
		})
	}
}
