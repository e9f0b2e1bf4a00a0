package redlease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// Issue 29, defects 1 and 2: calls to a paused server return by their ctx
// deadline, and without one within the library's own bounds, not the go-redis
// client's. Each test's client has read and write timeouts of a minute
// (clientTimeout), so a call that waits for the client's timeouts cannot
// return before a minute: the test waits giveUp, a third of that, plus 3 ×
// what this process was measured stalled, and a call that returned only
// after clientTimeout fails it whatever that window was. Either tells
// which timer ended the call (the library's, of at most a few seconds, or
// the client's), not how fast the machine is.
const (
	clientTimeout = time.Minute
	giveUp        = clientTimeout / 3
)

// pausedClient is a go-redis client to srv with clientTimeout on its
// sockets, ContextTimeoutEnabled cte, and its scripts loaded and one
// connection open (a warm-up TryLock through a strategy built by mk).
func pausedClient(t *testing.T, srv *redistest.Server, cte bool) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: clientTimeout, WriteTimeout: clientTimeout,
		ContextTimeoutEnabled: cte, DisableIdentity: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// within runs f and returns its error, or fails the test if f has not
// returned by giveUp plus 3 × what a probe measured this process stalled
// meanwhile (redistest.Await), or returned only after clientTimeout (an
// exact check, whatever the window: see clientTimeout).
func within(t *testing.T, what string, f func() error) error {
	t.Helper()
	probe := redistest.StartStallProbe(t)
	defer probe.Stop()
	got := make(chan error, 1)
	start := time.Now()
	go func() { got <- f() }()
	err := redistest.Await(t, probe, got, giveUp, 3, "%s: no return: held by the client's %v timeouts, not by its own bound", what, clientTimeout)
	if took := time.Since(start); took >= clientTimeout {
		t.Fatalf("%s: returned after %v, at the client's %v timeouts, not by its own bound", what, took.Round(time.Millisecond), clientTimeout)
	}
	return err
}

// primaryStrategies builds single and failover on c (failover on a server
// without replicas: with the server paused it never gets as far as WAIT).
func primaryStrategies(t *testing.T, c redis.UniversalClient) map[string]redlease.Strategy {
	t.Helper()
	s, err := single.New(c)
	require.NoError(t, err)
	f, err := failover.New(c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(); _ = f.Close() })
	return map[string]redlease.Strategy{"single": s, "failover": f}
}

// Defect 1: with ContextTimeoutEnabled and the server paused, a TryLock,
// Lock or Do whose attempt timed out returned only once the clean-up of
// that attempt (sent under a ctx without the deadline) gave up at the
// client's read timeout. Forced order: the server is stopped (SIGSTOP)
// before the call and resumed after it returned.
func TestAcquireReturnsByDeadlineOnPausedServer(t *testing.T) {
	t.Parallel()
	for _, cte := range []bool{true, false} {
		for _, name := range []string{"single", "failover"} {
			t.Run(fmt.Sprintf("%s/cte=%v", name, cte), func(t *testing.T) {
				t.Parallel() // each case on its own server
				srv := redistest.Start(t, redistest.Config{})
				s := primaryStrategies(t, pausedClient(t, srv, cte))[name]
				l, err := redlease.New(s, redlease.WithTTL(10*time.Second), redlease.WithPolling())
				require.NoError(t, err)
				warm, err := l.TryLock(t.Context(), "warm-"+name)
				if err == nil {
					require.NoError(t, warm.Release(t.Context()))
				}
				srv.Pause()
				defer srv.Resume()
				calls := map[string]func(ctx context.Context) error{
					"TryLock": func(ctx context.Context) error { _, err := l.TryLock(ctx, "k-"+name); return err },
					"Lock":    func(ctx context.Context) error { _, err := l.Lock(ctx, "k-"+name); return err },
					"Do": func(ctx context.Context) error {
						return l.Do(ctx, "k-"+name, func(context.Context, *redlease.Lock) error { return nil }, redlease.WithoutKeeper())
					},
				}
				for _, what := range []string{"TryLock", "Lock", "Do"} {
					err := within(t, what, func() error {
						ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
						defer cancel()
						return calls[what](ctx)
					})
					assert.ErrorIs(t, err, redlease.ErrUnavailable, what)
					assert.NotErrorIs(t, err, redlease.ErrNotObtained, "%s: an outage is not a refusal", what)
				}
			})
		}
	}
}

// Defect 2: the README's quick-start client (no ContextTimeoutEnabled) and
// calls without a deadline. TryLock, Extend and Release return within the
// library's default call bound; Lock and Do end an outage with
// ErrUnavailable after the Locker's outage limit. Forced order: the
// server is stopped (SIGSTOP) after the lock was taken.
//
// The four cases wait out the library's bounds (no deadline of their own),
// each on its own server: they run in parallel.
func TestNoDeadlineCallsEndOnPausedServer(t *testing.T) {
	t.Parallel()
	for _, cte := range []bool{false, true} {
		for _, name := range []string{"single", "failover"} {
			t.Run(fmt.Sprintf("%s/cte=%v", name, cte), func(t *testing.T) {
				t.Parallel()
				srv := redistest.Start(t, redistest.Config{})
				s := primaryStrategies(t, pausedClient(t, srv, cte))[name]
				ctx := context.Background()
				l, err := redlease.New(s, redlease.WithTTL(10*time.Second), redlease.WithPolling(),
					redlease.WithOutageLimit(300*time.Millisecond))
				require.NoError(t, err)
				lk, err := l.TryLock(ctx, "held-"+name)
				if name == "failover" {
					// No replica: the grant is released, unconfirmed (an
					// outage, not a refusal).
					require.ErrorIs(t, err, redlease.ErrUnavailable)
				} else {
					require.NoError(t, err)
				}
				srv.Pause()
				defer srv.Resume()
				err = within(t, "TryLock", func() error { _, err := l.TryLock(ctx, "k-"+name); return err })
				assert.ErrorIs(t, err, redlease.ErrUnavailable, "TryLock")
				if lk != nil {
					_, err = within(t, "Extend", func() error { return lk.Extend(ctx, 10*time.Second) }), error(nil)
					err = within(t, "Release", func() error { return lk.Release(ctx) })
					assert.ErrorIs(t, err, redlease.ErrUnavailable, "Release")
				}
				err = within(t, "Lock", func() error { _, err := l.Lock(ctx, "k-"+name); return err })
				assert.ErrorIs(t, err, redlease.ErrUnavailable, "Lock")
				assert.NotErrorIs(t, err, redlease.ErrNotObtained, "Lock: an outage is not a refusal")
				err = within(t, "Do", func() error {
					return l.Do(ctx, "k-"+name, func(context.Context, *redlease.Lock) error { return nil })
				})
				assert.ErrorIs(t, err, redlease.ErrUnavailable, "Do")
			})
		}
	}
}

// Defect 2 on quorum: every node paused, Lock and Do without a deadline
// end with ErrUnavailable after the outage limit (each round is bounded by
// the node timeout already).
func TestQuorumOutageEndsLock(t *testing.T) {
	t.Parallel()
	srvs := redistest.StartN(t, 3, redistest.Config{})
	var cs []redis.UniversalClient
	for _, s := range srvs {
		cs = append(cs, pausedClient(t, s, false))
	}
	q, err := quorum.New(cs)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	l, err := redlease.New(q, redlease.WithTTL(10*time.Second), redlease.WithPolling(),
		redlease.WithOutageLimit(300*time.Millisecond))
	require.NoError(t, err)
	for _, s := range srvs {
		s.Pause()
		defer s.Resume()
	}
	ctx := context.Background()
	err = within(t, "Lock", func() error { _, err := l.Lock(ctx, "k"); return err })
	assert.ErrorIs(t, err, redlease.ErrUnavailable, "Lock")
	err = within(t, "Do", func() error {
		return l.Do(ctx, "k", func(context.Context, *redlease.Lock) error { return nil })
	})
	assert.ErrorIs(t, err, redlease.ErrUnavailable, "Do")
}
