package redlease_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
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

// readmeSwitch classifies err as a caller would who checks "held" before
// "down" (the order a switch may take): it must never say "held" for an
// outage or a configuration error.
func readmeSwitch(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, redlease.ErrNotObtained):
		return "held"
	case errors.Is(err, redlease.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, redlease.ErrDenied):
		return "denied"
	}
	return "other"
}

// acquireCounter is an Observer that counts acquisition attempts and runs
// after (if set) when the first one ends.
type acquireCounter struct {
	n     atomic.Int32
	after func()
	mu    sync.Mutex
	errs  []error // each attempt's error, in order
}

func (o *acquireCounter) Start(ctx context.Context, op redlease.Op) (context.Context, func(error)) {
	if op.Name != "acquire" {
		return ctx, func(error) {}
	}
	return ctx, func(err error) {
		o.mu.Lock()
		o.errs = append(o.errs, err)
		o.mu.Unlock()
		if o.n.Add(1) == 1 && o.after != nil {
			o.after()
		}
	}
}
func (*acquireCounter) Held(redlease.Op, time.Duration, error)                       {}
func (*acquireCounter) NodeFailed(context.Context, redlease.Op, *redlease.NodeError) {}

// A grant that the paused replica did not acknowledge is an outage:
// ErrUnavailable (and ErrNotReplicated), never ErrNotObtained, so a switch
// that checks "held" first does not take it for a holder. Lock still
// retries it: the replica resumed after the first attempt, the second one
// gets the lock.
func TestUnacknowledgedGrantIsAnOutage(t *testing.T) {
	t.Parallel()
	primary := redistest.Start(t, redistest.Config{})
	replica := redistest.StartReplica(t, primary, redistest.Config{})
	c := primary.Client()
	replicated(t, c)
	s, err := failover.New(c, failover.WithWaitTimeout(100*time.Millisecond))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	replica.Pause()
	t.Cleanup(replica.Resume)
	l := newLocker(t, s, redlease.WithTTL(5*time.Second))
	_, err = l.TryLock(ctx, "outage:wait")
	require.Error(t, err)
	assert.ErrorIs(t, err, redlease.ErrUnavailable)
	assert.ErrorIs(t, err, failover.ErrNotReplicated)
	assert.NotErrorIs(t, err, redlease.ErrNotObtained)
	assert.Equal(t, "unavailable", readmeSwitch(err), "%v", err)

	// Lock retries an outage within its attempts, and returns it when
	// they are spent.
	obs := &acquireCounter{}
	l2 := newLocker(t, s, redlease.WithTTL(5*time.Second), redlease.WithObserver(obs))
	_, err = l2.Lock(ctx, "outage:wait", redlease.WithMaxAttempts(2), redlease.WithRetryDelay(time.Millisecond, 5*time.Millisecond))
	assert.ErrorIs(t, err, redlease.ErrUnavailable)
	assert.NotErrorIs(t, err, redlease.ErrNotObtained)
	assert.EqualValues(t, 2, obs.n.Load(), "attempts")

	obs = &acquireCounter{after: replica.Resume}
	l3 := newLocker(t, s, redlease.WithTTL(5*time.Second), redlease.WithObserver(obs))
	lk, err := l3.Lock(ctx, "outage:wait", redlease.WithMaxAttempts(3), redlease.WithRetryDelay(time.Millisecond, 5*time.Millisecond))
	require.NoError(t, err, "the attempt after the replica resumed")
	assert.EqualValues(t, 2, obs.n.Load(), "attempts")
	require.NoError(t, lk.Release(ctx))
}

// deniedServer starts a server with a user "reader" that may not run
// scripts, and one that requires a password; it returns clients that the
// server denies: NOPERM, WRONGPASS and NOAUTH.
func deniedClients(t *testing.T) (noperm, wrongpass, noauth *redis.Client) {
	t.Helper()
	a := redistest.Start(t, redistest.Config{})
	require.NoError(t, a.Client().Do(t.Context(), "ACL", "SETUSER", "reader", "on", ">s3cret", "~*", "+@read", "+hello", "+ping").Err())
	b := redistest.Start(t, redistest.Config{})
	require.NoError(t, b.Client().ConfigSet(t.Context(), "requirepass", "right").Err())
	mk := func(o *redis.Options) *redis.Client {
		o.ContextTimeoutEnabled = true
		c := redis.NewClient(o)
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	return mk(&redis.Options{Addr: a.Addr, Username: "reader", Password: "s3cret"}),
		mk(&redis.Options{Addr: b.Addr, Password: "wrong"}),
		mk(&redis.Options{Addr: b.Addr})
}

// NOPERM, WRONGPASS and NOAUTH are configuration errors: ErrDenied, neither
// ErrUnavailable nor ErrNotObtained, with the server's reply as the node's
// cause; Lock and Do return them after one attempt, not at their deadline.
func TestDeniedIsAConfigError(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	noperm, wrongpass, noauth := deniedClients(t)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second) // far past what a denial may take
	defer cancel()
	for name, tc := range map[string]struct {
		c  *redis.Client
		is func(error) bool
	}{
		"NOPERM":    {noperm, redis.IsPermissionError},
		"WRONGPASS": {wrongpass, redis.IsAuthError},
		"NOAUTH":    {noauth, redis.IsAuthError},
	} {
		sf, err := failover.New(tc.c)
		require.NoError(t, err)
		for sname, s := range map[string]redlease.Strategy{"single": mustSingle(t, tc.c), "failover": sf} {
			obs := &acquireCounter{}
			l := newLocker(t, s, redlease.WithObserver(obs))
			_, err := l.TryLock(ctx, "denied")
			require.Error(t, err, name)
			assert.ErrorIs(t, err, redlease.ErrDenied, "%s %s", name, sname)
			assert.NotErrorIs(t, err, redlease.ErrUnavailable, "%s %s", name, sname)
			assert.NotErrorIs(t, err, redlease.ErrNotObtained, "%s %s", name, sname)
			assert.True(t, tc.is(err), "%s %s: the server's reply is the cause: %v", name, sname, err)
			var ne *redlease.NodeError
			assert.ErrorAs(t, err, &ne, "%s %s", name, sname)
			assert.Equal(t, "denied", readmeSwitch(err), "%s %s: %v", name, sname, err)

			start := time.Now()
			_, err = l.Lock(ctx, "denied")
			assert.ErrorIs(t, err, redlease.ErrDenied, "%s %s: Lock", name, sname)
			err = l.Do(ctx, "denied", func(context.Context, *redlease.Lock) error { return errors.New("ran") })
			assert.ErrorIs(t, err, redlease.ErrDenied, "%s %s: Do", name, sname)
			if ok, why := probe.Within(time.Since(start), 2*time.Second, 3, start); !ok {
				assert.Failf(t, "outside the window derived from this run", "%s %s: Lock and Do returned at once: %s", name, sname, why)
			}
			assert.EqualValues(t, 3, obs.n.Load(), "%s %s: one attempt each for TryLock, Lock and Do", name, sname)
		}
	}
}

// A quorum fails with ErrDenied when the denials alone rule it out, and
// keeps every node's cause; a denied minority does not stop a grant. The
// node timeout is far above a denial's round trip, so that silence never
// decides a round here (at the default 100 ms a node slow to answer
// WRONGPASS under -race was counted silent: ErrUnavailable, retried).
func TestQuorumDeniedByAMajority(t *testing.T) {
	t.Parallel()
	noperm, wrongpass, _ := deniedClients(t)
	ok := redistest.StartN(t, 2, redistest.Config{})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	q, err := quorum.New([]redis.UniversalClient{noperm, wrongpass, ok[0].Client()}, quorum.WithNodeTimeout(5*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	obs := &acquireCounter{}
	l := newLocker(t, q, redlease.WithObserver(obs))
	_, err = l.Lock(ctx, "denied")
	require.Error(t, err)
	assert.ErrorIs(t, err, redlease.ErrDenied)
	assert.NotErrorIs(t, err, redlease.ErrUnavailable)
	assert.NotErrorIs(t, err, redlease.ErrNotObtained)
	assert.EqualValues(t, 1, obs.n.Load(), "Lock returned after one attempt: %v", obs.errs)
	var qe *redlease.QuorumError
	require.ErrorAs(t, err, &qe)
	require.Len(t, qe.Causes, 2, "%v", err)
	assert.True(t, redis.IsPermissionError(qe.Causes[0]), "%v", qe.Causes[0])
	assert.True(t, redis.IsAuthError(qe.Causes[1]), "%v", qe.Causes[1])

	q2, err := quorum.New([]redis.UniversalClient{noperm, ok[0].Client(), ok[1].Client()}, quorum.WithNodeTimeout(5*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = q2.Close() })
	lk, err := newLocker(t, q2).TryLock(ctx, "denied")
	require.NoError(t, err, "two of three nodes grant")
	require.NoError(t, lk.Release(ctx))
}

func mustSingle(t *testing.T, c redis.UniversalClient) redlease.Strategy {
	t.Helper()
	s, err := single.New(c)
	require.NoError(t, err)
	return s
}
