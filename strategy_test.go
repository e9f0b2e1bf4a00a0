package redlease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
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

func TestQuorumErrorUnwraps(t *testing.T) {
	cause := errors.New("connection refused")
	err := error(&redlease.QuorumError{
		Action: "acquire", Votes: 2, Quorum: 3, Nodes: 5, Err: redlease.ErrNotObtained,
		Causes: nil,
	})
	assert.ErrorIs(t, err, redlease.ErrNotObtained)
	var ne *redlease.NodeError
	assert.False(t, errors.As(err, &ne))

	qe := &redlease.QuorumError{Action: "acquire", Votes: 2, Quorum: 3, Nodes: 5, Err: redlease.ErrNotObtained}
	qe.Causes = append(qe.Causes, &redlease.NodeError{Node: 4, Addr: "127.0.0.1:1", Err: cause})
	err = qe
	require.ErrorAs(t, err, &ne)
	assert.Equal(t, 4, ne.Node)
	assert.ErrorIs(t, err, cause)
	assert.Contains(t, err.Error(), "2 of 5 nodes agreed, 3 needed")
	assert.Contains(t, err.Error(), "node 4 (127.0.0.1:1): connection refused")
}

// Errors read as one line with the "redlease:" prefix once: an Extend of a
// lock that ran out, a Lock whose ctx ended.
func TestErrorsAreOneLineWithOnePrefix(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, l, lk := fakeLock(t, redlease.WithTTL(time.Second), redlease.WithoutKeeper())
		time.Sleep(time.Until(lk.Until()))
		err := lk.Extend(t.Context(), time.Second)
		require.ErrorIs(t, err, redlease.ErrNotHeld)
		require.ErrorIs(t, err, redlease.ErrLost)
		for _, e := range []error{err, lk.Err()} {
			assert.NotContains(t, e.Error(), "\n")
			assert.Equal(t, 1, strings.Count(e.Error(), "redlease:"), "%s", e)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err = l.Lock(ctx, "k2")
		require.ErrorIs(t, err, redlease.ErrNotObtained)
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, 1, strings.Count(err.Error(), "redlease:"), "%s", err)
		assert.Equal(t, 1, strings.Count(err.Error(), "context canceled"), "%s", err)
	})
}

func TestWrapShowsThePrefixOnce(t *testing.T) {
	err := redlease.Wrap(redlease.ErrNotObtained, failover.ErrNotReplicated)
	assert.Equal(t, "redlease: lock not obtained: write not acknowledged by enough replicas", err.Error())
	assert.ErrorIs(t, err, redlease.ErrNotObtained)
	assert.ErrorIs(t, err, failover.ErrNotReplicated)
	assert.Same(t, redlease.ErrLost, redlease.Wrap(redlease.ErrLost, nil))
}

// onePrefix fails t unless err's message is one line with the
// "redlease:" prefix at most once.
func onePrefix(t *testing.T, what string, err error) {
	t.Helper()
	require.Error(t, err, what)
	assert.NotContains(t, err.Error(), "\n", what)
	assert.LessOrEqual(t, strings.Count(err.Error(), "redlease:"), 1, "%s: %s", what, err)
}

// No message of the common paths shows "redlease:" twice: refusals
// (single, quorum, fair mode's queue), outages (a dead node, a dead
// majority, a Lock whose ctx ended on either), a denial, the loss of a
// lock (refused extension, expiry after failed extensions, a release
// after a release), Do's error with the loss after it. A lock lost by
// expiry after failed extensions names the node that failed.
func TestCommonMessagesShowThePrefixOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	srv := redistest.Start(t, redistest.Config{})
	c := srv.Client()
	l := singleLocker(t, c, redlease.WithTTL(10*time.Second))
	var n int
	check := func(what string, err error) { t.Helper(); n++; t.Logf("%s: %v", what, err); onePrefix(t, what, err) }

	held, err := l.TryLock(ctx, "msg:held")
	require.NoError(t, err)
	_, err = l.TryLock(ctx, "msg:held")
	check("held (single)", err)
	short, cancelShort := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = l.Lock(short, "msg:held")
	cancelShort()
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	check("Lock's ctx ended on a held key", err)
	require.NoError(t, held.Release(ctx))
	check("Release after Release", held.Release(ctx))
	check("Extend after Release", held.Extend(ctx, time.Second))

	lk, err := l.TryLock(ctx, "msg:deleted")
	require.NoError(t, err)
	require.NoError(t, c.Del(ctx, "msg:deleted").Err())
	err = lk.Extend(ctx, 10*time.Second)
	require.ErrorIs(t, err, redlease.ErrNotHeld)
	check("Extend of a deleted key", err)
	check("Err of a lock lost to a refused extension", lk.Err())

	check("fair mode's refusal", &redlease.QuorumError{Action: "acquire", Votes: 0, Quorum: 2, Nodes: 3,
		Err: redlease.ErrNotObtained, Causes: []error{redlease.ErrQueued}})

	noperm, _, _ := deniedClients(t)
	_, err = singleLocker(t, noperm).TryLock(ctx, "msg:denied")
	require.ErrorIs(t, err, redlease.ErrDenied)
	check("denied", err)

	servers := redistest.StartN(t, 3, redistest.Config{})
	var clients []redis.UniversalClient
	for _, s := range servers {
		clients = append(clients, s.Client())
	}
	q, err := quorum.New(clients, quorum.WithNodeTimeout(grantNodeTimeout))
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	ql := newLocker(t, q, redlease.WithTTL(10*time.Second))
	qheld, err := ql.TryLock(ctx, "msg:held")
	require.NoError(t, err)
	_, err = ql.TryLock(ctx, "msg:held")
	check("held (quorum)", err)
	require.NoError(t, qheld.Release(ctx))
	servers[1].Kill()
	servers[2].Kill()
	_, err = ql.TryLock(ctx, "msg:down")
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	check("a majority down", err)
	short, cancelShort = context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = ql.Lock(short, "msg:down")
	cancelShort()
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	check("Lock's ctx ended with a majority down", err)

	// One node: the lock is taken, then the node dies; the extension
	// fails, and the loss by expiry names the node.
	dying := redistest.Start(t, redistest.Config{})
	dl := singleLocker(t, dying.Client(), redlease.WithTTL(3*time.Second), redlease.WithoutKeeper())
	lk, err = dl.TryLock(ctx, "msg:expired")
	require.NoError(t, err)
	var doErr error
	done, started := make(chan struct{}), make(chan struct{})
	dol := singleLocker(t, dying.Client(), redlease.WithTTL(time.Second))
	go func() {
		defer close(done)
		doErr = dol.Do(ctx, "msg:do", func(fctx context.Context, _ *redlease.Lock) error {
			close(started)
			<-fctx.Done() // the lock is lost once the node is dead
			return fmt.Errorf("fn stopped: %w", context.Cause(fctx))
		})
	}()
	select { // Do holds its lock before the node dies
	case <-started:
	case <-done:
		t.Fatalf("Do returned before fn ran: %v", doErr)
	}
	dying.Kill()
	ectx, cancelE := context.WithTimeout(ctx, 200*time.Millisecond)
	err = lk.Extend(ectx, 3*time.Second)
	cancelE()
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	_, err = dl.TryLock(ctx, "msg:dead")
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	check("the only node down", err)
	select {
	case <-lk.Lost():
	case <-ctx.Done():
		t.Fatal("the lock was never lost")
	}
	lost := lk.Err()
	check("Err of a lock lost by expiry after a failed extension", lost)
	require.ErrorIs(t, lost, redlease.ErrLost)
	var ne *redlease.NodeError
	require.ErrorAs(t, lost, &ne, "the failed node is reachable: %v", lost)
	assert.Contains(t, lost.Error(), dying.Addr, "the lost lock names the failed node")
	<-done
	require.ErrorIs(t, doErr, redlease.ErrLost)
	check("Do's error and the loss", doErr)
	assert.Contains(t, doErr.Error(), "fn stopped: ")
	assert.Equal(t, 14, n, "messages checked")
}

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
