package redlease_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/renew"
	"github.com/redlease/redlease/single"
)

// aclRule reads the documented rule (docs/redis-acl.conf), so the test and
// the documentation cannot drift apart.
func aclRule(t *testing.T, password string) []any {
	t.Helper()
	raw, err := os.ReadFile("docs/redis-acl.conf")
	require.NoError(t, err)
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "user redlease "); ok {
			args := []any{"ACL", "SETUSER", "redlease"}
			for _, f := range strings.Fields(rest) {
				if f == ">CHANGE-ME" {
					f = ">" + password
				}
				args = append(args, f)
			}
			return args
		}
	}
	t.Fatal("no user line in docs/redis-acl.conf")
	return nil
}

// aclServer starts a server with the documented user (and a second user
// without script rights), and returns a client as the documented user.
func aclServer(t *testing.T, srv *redistest.Server) *redis.Client {
	t.Helper()
	admin := srv.Client()
	require.NoError(t, admin.Do(t.Context(), aclRule(t, "s3cret")...).Err())
	require.NoError(t, admin.Do(t.Context(), "ACL", "SETUSER", "reader", "on", ">s3cret", "~*", "+@read", "+hello", "+ping").Err())
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "redlease", Password: "s3cret", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Every strategy, the watchdog and the idempotency barrier work as the
// least-privilege user of docs/redis-acl.conf.
func TestLeastPrivilegeUserRunsEverything(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	ctx := t.Context()
	primary := redistest.Start(t, redistest.Config{})
	replica := redistest.StartReplica(t, primary, redistest.Config{})
	_ = replica
	c := aclServer(t, primary)
	w, err := renew.New()
	require.NoError(t, err)
	defer w.Close()

	admin := primary.Client()
	take := func(name string, s redlease.Strategy) {
		t.Helper()
		l, err := redlease.New(s, redlease.WithPrefix("lock:"), redlease.WithTTL(2*time.Second), redlease.WithKeeper(w))
		require.NoError(t, err)
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second) // a refused command would otherwise be retried until the test's end
		defer cancel()
		err = l.Do(dctx, name, func(ctx context.Context, lk *redlease.Lock) error {
			time.Sleep(900 * time.Millisecond) // long enough for the watchdog's first extension
			return nil
		})
		require.NoError(t, err, name)
		require.NoError(t, admin.ScriptFlush(ctx).Err()) // the next use must load the scripts again, as this user
	}
	strategy, err := single.New(c)
	require.NoError(t, err)
	take("single", strategy)
	strategy2, err := failover.New(c)
	require.NoError(t, err)
	take("failover", strategy2)

	// A waiter, as this user: it subscribes to the key's wake channel and
	// the release publishes on it (both need the file's channel rights),
	// so it gets the lock at once rather than at its backoff (5–10 s).
	wl := singleLocker(t, c, redlease.WithPrefix("lock:"), redlease.WithTTL(10*time.Second))
	holder, err := wl.TryLock(ctx, "waited")
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		lk, err := wl.Lock(wctx, "waited", redlease.WithRetryDelay(5*time.Second, 10*time.Second))
		if err == nil {
			err = lk.Release(ctx)
		}
		got <- err
	}()
	probe.WaitFor(t, 5*time.Second, 3, 10*time.Millisecond, func() bool { // the waiter subscribed (after its first refusal)
		n, err := admin.PubSubNumSub(ctx, "redlease:wake:{lock:waited}").Result()
		return err == nil && n["redlease:wake:{lock:waited}"] > 0
	}, "the waiter subscribes to the key's wake channel")
	released := time.Now()
	require.NoError(t, holder.Release(ctx))
	require.NoError(t, <-got)
	if ok, why := probe.Within(time.Since(released), 2*time.Second, 3, released); !ok {
		assert.Failf(t, "outside the window derived from this run", "the waiter was woken by the release, not by its 5–10 s backoff: %s", why)
	}

	nodes := redistest.StartN(t, 3, redistest.Config{})
	var clients []redis.UniversalClient
	for _, n := range nodes {
		clients = append(clients, aclServer(t, n))
	}
	q, err := quorum.New(clients, quorum.WithFencing(), quorum.WithDelayedRestart(2*time.Second))
	require.NoError(t, err)
	defer q.Close()
	for _, n := range nodes { // the nodes have been up longer than the max TTL
		require.NoError(t, redistest.AgeBootMarker(ctx, n.Client(), time.Hour))
	}
	take("quorum", q)

	strategy4, err := single.New(c)
	require.NoError(t, err)
	b, err := idempotency.New(c, idempotency.WithStrategy(strategy4))
	require.NoError(t, err)
	out, err := b.Do(ctx, idempotency.Request{Key: "order:1", Fingerprint: "fp"}, func(context.Context, uint64) ([]byte, error) { return []byte("ok"), nil })
	require.NoError(t, err)
	replay, err := b.Do(ctx, idempotency.Request{Key: "order:1", Fingerprint: "fp"}, func(context.Context, uint64) ([]byte, error) { return nil, errors.New("ran twice") })
	require.NoError(t, err)
	assert.True(t, replay.Replayed)
	assert.Equal(t, out.Result, replay.Result)
	tokens, err := idempotency.NewTokens(c, "")
	require.NoError(t, err)
	tok, err := tokens.Issue(ctx, "form", time.Minute)
	require.NoError(t, err)
	require.NoError(t, tokens.Consume(ctx, "form", tok))
}

// A user without the rights gets a clear error at once, not a hang.
func TestUserWithoutRightsFailsClearly(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	aclServer(t, srv)
	reader := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "reader", Password: "s3cret", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = reader.Close() })
	wrongKeys := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "redlease", Password: "s3cret", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = wrongKeys.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()

	start := time.Now()
	locker := singleLocker(t, reader)
	_, err := locker.TryLock(ctx, "lock:x")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NOPERM", "the cause names the missing permission")
	assert.ErrorIs(t, err, redlease.ErrDenied)
	assert.NotErrorIs(t, err, redlease.ErrNotObtained)

	locker2 := singleLocker(t, wrongKeys)
	_, err = locker2.TryLock(ctx, "other:x") // outside the allowed key patterns
	require.Error(t, err)
	assert.Contains(t, err.Error(), "NOPERM")
	if ok, why := probe.Within(time.Since(start), time.Second, 3, start); !ok {
		assert.Failf(t, "outside the window derived from this run", "refused at once: %s", why)
	}
}

// A user of the ACL written before fair mode (no EXISTS or sorted-set
// commands) still locks and waits with fairness on: the line is ignored
// (the acquire script's EXISTS is refused under redis.pcall), never a
// NOPERM. With the documented rule the waiter is in line.
func TestUserWithoutFairRightsIsServedUnfairly(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	admin := srv.Client()
	ctx := t.Context()
	var rule []any
	for _, a := range aclRule(t, "s3cret") {
		switch a {
		case "+exists", "+zadd", "+zrem", "+zrangebyscore":
			continue
		}
		rule = append(rule, a)
	}
	require.NoError(t, admin.Do(ctx, rule...).Err())
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "redlease", Password: "s3cret", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	l := singleLocker(t, c, redlease.WithFairness(true), redlease.WithPrefix("lock:"), redlease.WithTTL(10*time.Second), redlease.WithRetryDelay(time.Millisecond, 20*time.Millisecond))
	holder, err := l.TryLock(ctx, "old-acl")
	require.NoError(t, err)
	got := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		lk, err := l.Lock(wctx, "old-acl")
		if err == nil {
			err = lk.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond) // not a race decider: the waiter retries every ≤ 20 ms meanwhile, and must not fail
	require.NoError(t, holder.Release(ctx))
	require.NoError(t, <-got)
	n, err := admin.Exists(ctx, script.QueueKey("lock:old-acl")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "no line without the rights")
}

// An operator's Inspect and ForceRelease work as the least-privilege user
// of docs/redis-acl.conf: the line's waiters and the holder record are
// read (their commands are granted, not skipped by the script's pcall),
// and the forced release deletes the key.
func TestLeastPrivilegeUserInspectsAndForces(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv := redistest.Start(t, redistest.Config{})
	c := aclServer(t, srv)
	admin := srv.Client()
	s, err := single.New(c)
	require.NoError(t, err)
	l := newLocker(t, s, redlease.WithPrefix("lock:"))
	lk, err := l.TryLock(ctx, "ops")
	require.NoError(t, err)
	_, err = s.AcquireInLine(ctx, "lock:ops", "w.1", time.Second, redlease.Place{ID: "w", Ticket: time.Now(), Join: true, Lifetime: 10 * time.Second})
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	require.NoError(t, admin.HSet(ctx, script.HolderKey("lock:ops"), "token", lk.Token(), "host", "h", "pid", "7").Err())
	require.NoError(t, admin.ScriptFlush(ctx).Err()) // loaded again, as this user

	in, err := l.Inspect(ctx, "ops")
	require.NoError(t, err)
	assert.Equal(t, redlease.KeyHeld, in.State)
	assert.Equal(t, 1, in.Waiters, "ZRANGEBYSCORE granted")
	require.NotNil(t, in.Holder, "HMGET granted")
	assert.Equal(t, 7, in.Holder.PID)

	r, err := l.ForceRelease(ctx, "ops", in.Token)
	require.NoError(t, err)
	assert.Equal(t, 1, r.Deleted)
	assert.ErrorIs(t, lk.Extend(ctx, time.Minute), redlease.ErrNotHeld)
}
