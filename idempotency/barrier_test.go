package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
)

func TestMain(m *testing.M) {
	redistest.QuietClientLogs()
	goleak.VerifyTestMain(m)
}

func store(t *testing.T) *redis.Client {
	t.Helper()
	return redistest.Start(t, redistest.Config{}).Client()
}

func barrier(t *testing.T, c redis.UniversalClient, opts ...idempotency.Option) *idempotency.Barrier {
	t.Helper()
	b, err := idempotency.New(c, opts...)
	require.NoError(t, err)
	return b
}

// staleLease is the lease of a first owner whose lock must run out while
// its handler runs (the tests wait for it to run out, they do not sleep).
// Its first Do must claim the request inside it: under 200 ms a first Do
// ran out of its lease before its handler started, once in 10 runs of
// TestStaleOwnersCompleteIsRejected under -race at load 22.
const staleLease = time.Second

// waitLockGone waits until the lock of the request key has expired in the
// store of c (a lease with no renewal runs out): for 5 s plus staleLease,
// plus 3 × what probe measured this process stalled meanwhile.
func waitLockGone(t *testing.T, probe *redistest.StallProbe, c redis.UniversalClient, key string) {
	t.Helper()
	lock := requestLock("idem:", key)
	probe.WaitFor(t, 5*time.Second+staleLease, 3, 5*time.Millisecond, func() bool {
		n, err := c.Exists(t.Context(), lock).Result()
		return err == nil && n == 0
	}, "the lock %s of request %q never expired", lock, key)
}

// awaitHandler waits until a request's handler has started, or fails the
// test with the request's error if the request ended first: a wait for a
// handler that never runs must not hang the test.
func awaitHandler(t *testing.T, started <-chan struct{}, done <-chan error) {
	t.Helper()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("the first request ended before its handler ran: %v", err)
	}
}

// closeBarrier closes b, waiting for its runs in flight (at most 10 s).
func closeBarrier(t *testing.T, b *idempotency.Barrier) {
	t.Helper()
	closer, ok := any(b).(interface{ Close(context.Context) error })
	require.True(t, ok, "a Barrier has Close(ctx)")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, closer.Close(ctx), "every run in flight finished")
}

// Close waits for the runs in flight; when its ctx ends first it cancels
// their handlers (cause ErrClosed). A handler that then returns an error
// has an unknown outcome: released, and a retry runs it. One that returns
// a success while its lock is valid is recorded. A Barrier closed refuses
// new requests with ErrClosed.
func TestCloseCancelsHandlersAtTheEndOfItsGrace(t *testing.T) {
	c := store(t)
	b := barrier(t, c)
	var charges atomic.Int32
	causes := make(chan error, 2)
	started := make(chan struct{}, 2)
	waitCtx := func(answer []byte, err error) idempotency.Handler {
		return func(ctx context.Context, fence uint64) ([]byte, error) {
			charges.Add(1)
			started <- struct{}{}
			<-ctx.Done()
			causes <- context.Cause(ctx)
			if err != nil {
				return nil, err
			}
			return answer, nil
		}
	}
	cctx, cancel := context.WithCancel(t.Context())
	results := make(chan error, 2)
	go func() {
		_, err := b.Do(cctx, idempotency.Request{Key: "unknown"}, waitCtx(nil, errors.New("stopped half-way")))
		results <- err
	}()
	go func() {
		_, err := b.Do(cctx, idempotency.Request{Key: "done"}, waitCtx([]byte("done anyway"), nil))
		results <- err
	}()
	<-started
	<-started
	cancel() // both callers leave; their runs go on
	for range 2 {
		assert.ErrorIs(t, <-results, context.Canceled)
	}

	grace, end := context.WithCancel(t.Context())
	end() // no grace at all
	err := b.Close(grace)
	assert.ErrorIs(t, err, context.Canceled, "Close gave up waiting")
	for range 2 {
		assert.ErrorIs(t, <-causes, idempotency.ErrClosed, "the handler's ctx was cancelled by Close")
	}
	closeBarrier(t, b) // a second Close waits for them
	_, err = b.Do(t.Context(), idempotency.Request{Key: "new"}, result(&charges, "x"))
	assert.ErrorIs(t, err, idempotency.ErrClosed)

	next := barrier(t, c)
	out, err := next.Do(t.Context(), idempotency.Request{Key: "unknown"}, result(&charges, "ran again"))
	require.NoError(t, err)
	assert.False(t, out.Replayed, "an error returned after Close's cancel is not an outcome")
	out, err = next.Do(t.Context(), idempotency.Request{Key: "done"}, result(&charges, "ran again"))
	require.NoError(t, err)
	assert.True(t, out.Replayed, "a success returned under a valid lock is recorded")
	assert.Equal(t, "done anyway", string(out.Result))
	assert.EqualValues(t, 3, charges.Load())
}

// sentinelMaster starts a primary with one replica and one Sentinel
// monitoring it as master, and returns a redis.NewFailoverClient for it
// (its address, as go-redis reports it, is "FailoverClient" whatever the
// master) with its Sentinel's address.
func sentinelMaster(t *testing.T, master string) *redis.Client {
	t.Helper()
	primary := redistest.Start(t, redistest.Config{})
	redistest.StartReplica(t, primary, redistest.Config{})
	sentinels := redistest.StartSentinels(t, primary, master, 1, 1, time.Minute)
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: master, SentinelAddrs: redistest.Addrs(sentinels), ContextTimeoutEnabled: true,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A Close whose grace ended with runs in flight says so, also when the
// runs it cancelled finish before it returns: the error is the caller's
// only word that handlers were cut short. Forced order: Close cancels the
// handler, and (a hook in Close) the run returns, releases and leaves
// before Close decides what to return.
func TestCloseThatCancelledAHandlerSaysSoEvenIfTheRunFinishedFirst(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	b := barrier(t, store(t))
	finished := false
	idempotency.SetCloseAfterStop(t, b, func(idle <-chan struct{}) {
		redistest.Await(t, probe, idle, 5*time.Second, 3, "the cancelled run never finished")
		finished = true
	})
	started := make(chan struct{})
	cctx, cancel := context.WithCancel(t.Context())
	left := make(chan error, 1)
	go func() {
		_, err := b.Do(cctx, idempotency.Request{Key: "cut-short"}, func(ctx context.Context, _ uint64) ([]byte, error) {
			close(started)
			<-ctx.Done()
			return nil, errors.New("stopped half-way")
		})
		left <- err
	}()
	redistest.Await(t, probe, started, 5*time.Second, 3, "the handler never started")
	cancel() // the caller leaves; the run goes on
	require.ErrorIs(t, redistest.Await(t, probe, left, 5*time.Second, 3, "the caller never returned"), context.Canceled)

	grace, end := context.WithCancel(t.Context())
	end() // no grace at all
	err := b.Close(grace)
	require.True(t, finished, "the hook ran: the run had finished when Close decided")
	require.ErrorIs(t, err, context.Canceled, "Close cancelled a handler and must say so")
}

// Two Barriers on one store and prefix whose locks live on two different
// Sentinel masters, each through a failover strategy over a
// redis.NewFailoverClient: their locks exclude nothing between them, and
// their fences come from two unrelated counters. While one runs a request,
// the other's claim (its lock granted on its own master, under a fence its
// counter made higher) must answer ErrInProgress, never take the record
// over and charge a second time. Each strategy names its master
// (failover.WithMaster), which tells the two lock schemes apart. Forced
// order: the second call is made from inside the first call's handler,
// after released runs on each master made the second's fence counter the
// higher (a counter created anew starts from its server's clock: master
// b's is created after master a's).
func TestBarriersOnTwoSentinelMastersNeverRunARequestTwice(t *testing.T) {
	store := store(t)
	ctx := t.Context()
	onMaster := func(master string) *idempotency.Barrier {
		fs, err := failover.New(sentinelMaster(t, master), failover.WithMaster(master))
		require.NoError(t, err)
		t.Cleanup(func() { _ = fs.Close() })
		return barrier(t, store, idempotency.WithStrategy(fs), idempotency.WithLease(5*time.Second))
	}
	a, b := onMaster("master-a"), onMaster("master-b")
	req := idempotency.Request{Key: "pay:two-masters"}

	// Runs that fail (not Final) release the request: one on master a,
	// then two on master b, whose counter is created later and so stands
	// higher.
	var highestB uint64
	declined := func(_ context.Context, fence uint64) ([]byte, error) {
		highestB = fence
		return nil, errors.New("declined for now")
	}
	_, err := a.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return nil, errors.New("declined for now") })
	require.Error(t, err)
	for range 2 {
		_, err := b.Do(ctx, req, declined)
		require.Error(t, err)
	}

	var charges atomic.Int32
	var secondErr error
	out, err := a.Do(ctx, req, func(_ context.Context, fence uint64) ([]byte, error) {
		charges.Add(1)
		assert.Less(t, fence, highestB, "the forced order: master b's next fence is above master a's")
		_, secondErr = b.Do(ctx, req, func(_ context.Context, fence uint64) ([]byte, error) {
			charges.Add(1)
			return []byte("charged on master b"), nil
		})
		return []byte("charged on master a"), nil
	})
	assert.ErrorIs(t, secondErr, idempotency.ErrInProgress, "master b's claim answers in progress")
	assert.EqualValues(t, 1, charges.Load(), "one charge")
	require.NoError(t, err, "master a's run is recorded")
	assert.Equal(t, "charged on master a", string(out.Result))

	out, err = b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
		charges.Add(1)
		return nil, nil
	})
	require.NoError(t, err)
	assert.True(t, out.Replayed, "master b replays master a's run")
	assert.Equal(t, "charged on master a", string(out.Result))
	assert.EqualValues(t, 1, charges.Load(), "one charge")
}

// A lock strategy whose placement does not say where its locks live is
// refused: failover or single over a redis.NewFailoverClient ("primary
// FailoverClient" for every master), or a quorum with such a node. Named
// by failover.WithMaster, the failover strategy is accepted; the default
// lock on a NewFailoverClient store is the store's own. The clients are
// never dialled.
func TestStrategiesThatCannotNameTheirMasterAreRefused(t *testing.T) {
	fc := func(master string) *redis.Client {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: []string{"127.0.0.1:1"}})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	st := fc("store")
	bare, err := failover.New(fc("a"))
	require.NoError(t, err)
	assert.Equal(t, "primary FailoverClient", bare.Placement())
	q, err := quorum.New([]redis.UniversalClient{store(t), fc("b"), store(t)}, quorum.WithFencing())
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	for _, s := range []redlease.Strategy{bare, singleOn(t, fc("c")), q, singleOn(t, st)} {
		_, err := idempotency.New(st, idempotency.WithStrategy(s))
		require.ErrorIs(t, err, redlease.ErrInvalid, "%T %s", s, s.(redlease.Placer).Placement())
		assert.ErrorContains(t, err, "failover.WithMaster")
	}

	named, err := failover.New(fc("a"), failover.WithMaster("a"))
	require.NoError(t, err)
	assert.Equal(t, "failover a", named.Placement())
	_, err = idempotency.New(st, idempotency.WithStrategy(named))
	require.NoError(t, err)
	_, err = idempotency.New(st)
	require.NoError(t, err, "the default lock on the store")
}

// Two Barriers on one store and prefix, one on the store's own lock, one
// on a quorum of other nodes (a rolling move from the default lock to
// quorum): they share records but not locks. While one runs a request,
// the other's claim (its own lock granted, on its own nodes) finds the
// record in progress under the other lock scheme: it must answer
// ErrInProgress, never take the record over and run the request a second
// time. Forced order: the second call is made from inside the first
// call's handler. Both directions.
func TestBarriersOnTwoLockSchemesNeverRunARequestTwice(t *testing.T) {
	c := store(t)
	nodes := store(t) // the quorum's one node: not the store
	q, err := quorum.New([]redis.UniversalClient{nodes})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	onStore := barrier(t, c)
	onQuorum := barrier(t, c, idempotency.WithStrategy(q))
	ctx := t.Context()

	for i, pair := range [][2]*idempotency.Barrier{{onStore, onQuorum}, {onQuorum, onStore}} {
		first, second := pair[0], pair[1]
		req := idempotency.Request{Key: fmt.Sprintf("pay:schemes:%d", i)}
		var charges atomic.Int32
		out, err := first.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			charges.Add(1)
			// A claim that no node decided within the default 100 ms
			// node timeout (at load 15-30 one was not) answers nothing:
			// it is tried again, at most 20 times.
			var derr error
			for range 20 {
				_, derr = second.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
					charges.Add(1)
					return []byte("charged by the second"), nil
				})
				if !errors.Is(derr, redlease.ErrUnavailable) {
					break
				}
			}
			assert.ErrorIs(t, derr, idempotency.ErrInProgress, "pair %d: the other scheme's claim answers in progress", i)
			return []byte("charged by the first"), nil
		})
		assert.NoError(t, err, "pair %d: the first run is recorded", i)
		assert.Equal(t, "charged by the first", string(out.Result))
		assert.EqualValues(t, 1, charges.Load(), "pair %d: one charge", i)

		out, err = second.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			charges.Add(1)
			return nil, nil
		})
		require.NoError(t, err)
		assert.True(t, out.Replayed, "pair %d: the other scheme replays the first run", i)
		assert.Equal(t, "charged by the first", string(out.Result))
		assert.EqualValues(t, 1, charges.Load(), "pair %d: one charge", i)
	}
}

// A record in progress that names no lock scheme (written before records
// did, by an owner whose lock is gone) is taken over as before, through
// either scheme; the claim then records its own scheme.
func TestRecordWithoutASchemeIsTakenOverAsBefore(t *testing.T) {
	c := store(t)
	nodes := store(t)
	q, err := quorum.New([]redis.UniversalClient{nodes})
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	ctx := t.Context()
	for i, b := range []*idempotency.Barrier{barrier(t, c), barrier(t, c, idempotency.WithStrategy(q))} {
		req := idempotency.Request{Key: fmt.Sprintf("pay:old-format:%d", i)}
		rec := "idem:r:" + req.Key
		require.NoError(t, c.HSet(ctx, rec, "state", "p", "owner", "crashed.1", "fence", "0", "fp", "").Err())
		require.NoError(t, c.Expire(ctx, rec, time.Hour).Err())
		var scheme string
		var out idempotency.Outcome
		// A claim that no node decided within the default 100 ms node
		// timeout answers nothing (at load 20, beside yes x2 and other
		// test runs, one was not: "0 of 1 nodes agreed ... after 104ms"):
		// it is tried again, at most 20 times.
		for range 20 {
			out, err = b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
				scheme = c.HGet(ctx, rec, "ls").Val()
				return []byte("ran"), nil
			})
			if !errors.Is(err, redlease.ErrUnavailable) {
				break
			}
		}
		require.NoError(t, err, "Barrier %d takes the old record over", i)
		assert.False(t, out.Replayed)
		assert.NotEmpty(t, scheme, "Barrier %d records its scheme", i)
	}
}

// The single strategy given explicitly on the store's own client is the
// store's own lock (the same key on the same Redis): a record in progress
// that the default lock claimed, whose owner's lock is gone, is taken over
// through it, and the other way round.
func TestSingleOnTheStoreIsTheStoresOwnLockScheme(t *testing.T) {
	c := store(t)
	ctx := t.Context()
	byDefault := barrier(t, c)
	explicit := barrier(t, c, idempotency.WithStrategy(singleOn(t, c)))
	for i, pair := range [][2]*idempotency.Barrier{{byDefault, explicit}, {explicit, byDefault}} {
		req := idempotency.Request{Key: fmt.Sprintf("pay:same-scheme:%d", i)}
		rec := "idem:r:" + req.Key
		var scheme string
		_, err := pair[0].Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			scheme = c.HGet(ctx, rec, "ls").Val()
			// The owner dies: its lock goes, its record stays in progress.
			require.NoError(t, c.Del(ctx, requestLock("idem:", req.Key)).Err())
			require.NoError(t, c.HSet(ctx, rec, "owner", "crashed.1").Err())
			return nil, errors.New("never recorded: the owner crashed")
		})
		require.Error(t, err)
		assert.Equal(t, "store", scheme, "pair %d", i)
		require.NoError(t, c.HSet(ctx, rec, "state", "p", "owner", "crashed.1", "fence", "1", "fp", "", "ls", scheme).Err())
		out, err := pair[1].Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte("ran"), nil })
		require.NoError(t, err, "pair %d: taken over through the same scheme", i)
		assert.Equal(t, "ran", string(out.Result))
	}
}

// Placements name where a strategy takes a key: single and failover on
// one client the same, a quorum by its nodes whatever their order, and
// different nodes differently.
func TestPlacementsNameWhereKeysAreTaken(t *testing.T) {
	a, b := store(t), store(t)
	f, err := failover.New(a)
	require.NoError(t, err)
	t.Cleanup(func() { _ = f.Close() })
	quorumOn := func(nodes ...redis.UniversalClient) string {
		q, err := quorum.New(nodes)
		require.NoError(t, err)
		t.Cleanup(func() { _ = q.Close() })
		return q.Placement()
	}
	assert.Equal(t, singleOn(t, a).Placement(), f.Placement(), "single and failover on one client")
	assert.NotEqual(t, singleOn(t, a).Placement(), singleOn(t, b).Placement())
	assert.Equal(t, quorumOn(a, b), quorumOn(b, a), "a quorum's placement does not depend on the order of its nodes")
	assert.NotEqual(t, quorumOn(a, b), quorumOn(a))
}

// scanAll returns every key on c.
func scanAll(t *testing.T, c *redis.Client) []string {
	t.Helper()
	var keys []string
	var cursor uint64
	for i := 0; ; i++ {
		require.Less(t, i, 100000, "SCAN does not end")
		page, next, err := c.Scan(t.Context(), cursor, "*", 1000).Result()
		require.NoError(t, err)
		keys = append(keys, page...)
		if cursor = next; cursor == 0 {
			return keys
		}
	}
}

// firstFew names a few of keys, for a failure message.
func firstFew(keys []string) string {
	return fmt.Sprintf("%d keys, e.g. %q", len(keys), keys[:min(3, len(keys))])
}

// A Barrier leaves nothing on its store that lives forever: after many
// requests with a short retention every key has a TTL — the fence counters
// of the request locks included — and after retention+lease no key of the
// Barrier is left at all.
func TestBarrierLeavesNoKeyWithoutATTL(t *testing.T) {
	t.Parallel()
	c := store(t)
	const lease, retention, requests = 200 * time.Millisecond, time.Second, 500
	b := barrier(t, c, idempotency.WithLease(lease), idempotency.WithRetention(retention))
	ctx := t.Context()
	// A request is sent again, as a client would, while the answer says
	// to retry (in progress, not recorded): under a 200 ms lease a loaded
	// machine gets those answers now and then, and they are not what this
	// test checks. Bounded: 10 sends per request.
	retried := 0
	for i := range requests {
		var err error
		for try := range 10 {
			if try > 0 {
				retried++
				time.Sleep(lease)
			}
			_, err = b.Do(ctx, idempotency.Request{Key: fmt.Sprintf("req:%d", i)}, func(context.Context, uint64) ([]byte, error) {
				return []byte("ok"), nil
			})
			if !errors.Is(err, idempotency.ErrInProgress) && !errors.Is(err, idempotency.ErrNotRecorded) {
				break
			}
		}
		require.NoError(t, err, "request %d, after %d sends in all were retried", i, retried)
	}
	t.Logf("%d requests, %d sends retried on a retry answer", requests, retried)
	last := time.Now()

	keys := scanAll(t, c)
	require.NotEmpty(t, keys)
	var forever []string
	for _, k := range keys {
		pttl, err := c.PTTL(ctx, k).Result()
		require.NoError(t, err)
		if pttl == -1 { // -1: no TTL; -2: expired since the SCAN
			forever = append(forever, k)
		}
	}
	assert.Zero(t, len(forever), "keys without a TTL after %d requests: %s", requests, firstFew(forever))

	time.Sleep(time.Until(last.Add(retention + lease + 200*time.Millisecond)))
	var left []string
	for _, k := range scanAll(t, c) {
		n, err := c.Exists(ctx, k).Result() // EXISTS expires a key whose time has come
		require.NoError(t, err)
		if n == 1 {
			left = append(left, k)
		}
	}
	assert.Zero(t, len(left), "keys left retention+lease after the last request: %s", firstFew(left))
}

// assertWithin checks that what began at start and took took stayed
// within bound, plus stallMultiple times what p measured this process
// stalled meanwhile; the failure message says how the window was derived.
func assertWithin(t *testing.T, p *redistest.StallProbe, bound time.Duration, start time.Time, took time.Duration, what string, args ...any) {
	t.Helper()
	end := start.Add(took)
	assert.Less(t, took, p.Allowance(bound, stallMultiple, start, end), "%s: took %v; %s",
		fmt.Sprintf(what, args...), took, p.Explain(bound, stallMultiple, start, end))
}

// stallMultiple is the multiple of this process's measured stall that a
// timing assertion here allows on top of its bound
// (redistest.StallProbe.Allowance).
const stallMultiple = 2
