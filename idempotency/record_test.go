package idempotency_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/renew"
)

func TestResultsAreBounded(t *testing.T) {
	b := barrier(t, store(t), idempotency.WithMaxResult(10))
	ctx := t.Context()
	out, err := b.Do(ctx, idempotency.Request{Key: "big"}, func(context.Context, uint64) ([]byte, error) {
		return []byte("more than ten bytes"), nil
	})
	require.NoError(t, err, "the first caller gets its result")
	assert.Equal(t, "more than ten bytes", string(out.Result))
	_, err = b.Do(ctx, idempotency.Request{Key: "big"}, func(context.Context, uint64) ([]byte, error) { return nil, errors.New("must not run") })
	assert.ErrorIs(t, err, idempotency.ErrResultNotStored, "a duplicate learns it completed, and nothing runs again")
}

// failFast is a store client that gives up on a silent server after
// 100 ms, without retrying: a store "blink" is an error to it, not a wait.
func failFast(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// The handler books, then the store blinks (SIGSTOP for 300 ms) before the
// result lands. The result is stored once the store is back — the request
// is not left in progress, the caller is not told it failed, and a
// duplicate replays instead of booking again.
func TestResultIsRecordedAfterAStoreBlink(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	b := barrier(t, failFast(t, srv.Addr), idempotency.WithLease(5*time.Second), idempotency.WithRetention(time.Minute))
	ctx := t.Context()
	req := idempotency.Request{Key: "book"}
	var runs atomic.Int32
	resumed := make(chan struct{})
	out, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
		runs.Add(1)
		srv.Pause() // booked; now the store blinks
		go func() {
			defer close(resumed)
			time.Sleep(300 * time.Millisecond)
			srv.Resume()
		}()
		return []byte("booked"), nil
	})
	<-resumed
	require.NoError(t, err, "the result is recorded once the store is back")
	assert.Equal(t, "booked", string(out.Result))
	assert.NotZero(t, out.Fence)

	replay, err := b.Do(ctx, req, result(&runs, "booked again"))
	require.NoError(t, err)
	assert.True(t, replay.Replayed)
	assert.Equal(t, "booked", string(replay.Result))
	assert.EqualValues(t, 1, runs.Load(), "booked once")
}

// heldStore is a Barrier whose store is reached through a Gate, with a
// client that gives up after 100 ms, and a direct client to look at it.
// One request has run through it, so the store knows every script: a held
// EVALSHA that lands late is applied, not answered NOSCRIPT.
func heldStore(t *testing.T, opts ...idempotency.Option) (*idempotency.Barrier, *redistest.Gate, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t, redistest.Config{})
	gate := redistest.NewGate(t, srv.Addr)
	b := barrier(t, failFast(t, gate.Addr), opts...)
	_, err := b.Do(t.Context(), idempotency.Request{Key: "warm-up"}, func(context.Context, uint64) ([]byte, error) { return nil, nil })
	require.NoError(t, err)
	return b, gate, srv.Client()
}

// land forwards every held request, oldest first, each answered before the
// next: a store that comes back and applies what it was sent.
func land(t *testing.T, gate *redistest.Gate) {
	t.Helper()
	gate.HoldRequests("")
	for i := 0; gate.Held() > 0; i++ {
		require.Less(t, i, 1000, "held requests keep coming")
		require.NoError(t, gate.Step("", 2*time.Second))
	}
}

// The store takes no result for as long as the request's lock is held:
// the caller gets the handler's Outcome and ErrNotRecorded (with the store
// error), not a failure to retry; the record stays in progress, and once
// the store applies the late result a duplicate replays it.
func TestResultThatCannotBeRecordedIsReportedAsSuch(t *testing.T) {
	const mark = "booked-6c1f" // only the complete requests carry the result
	b, gate, direct := heldStore(t, idempotency.WithLease(500*time.Millisecond), idempotency.WithRetention(time.Minute))
	ctx := t.Context()
	req := idempotency.Request{Key: "book"}
	var runs atomic.Int32
	gate.HoldRequests(mark)
	probe := redistest.StartStallProbe(t)
	start := time.Now()
	out, err := b.Do(ctx, req, result(&runs, mark))
	elapsed := time.Since(start)
	t.Logf("after %v: %v", elapsed.Round(time.Millisecond), err)
	require.ErrorIs(t, err, idempotency.ErrNotRecorded)
	var netErr net.Error
	assert.ErrorAs(t, err, &netErr, "the store error is kept")
	assert.Equal(t, mark, string(out.Result), "the handler's result")
	assert.NotZero(t, out.Fence)
	assert.GreaterOrEqual(t, gate.HeldContaining(mark), 2, "tried again")
	assertWithin(t, probe, 2*time.Second, start, elapsed, "gave up at the loss of the lock")
	state, err := direct.HGet(ctx, "idem:r:book", "state").Result()
	require.NoError(t, err)
	assert.Equal(t, "p", state, "the record stays in progress under its owner")

	land(t, gate)
	replay, err := b.Do(ctx, req, result(&runs, "booked again"))
	require.NoError(t, err)
	assert.True(t, replay.Replayed, "the late result landed: owner-checked, and idempotent")
	assert.Equal(t, mark, string(replay.Result))
	assert.EqualValues(t, 1, runs.Load())
}

// stopSpy keeps locks with inner and says, each time the Barrier stops
// keeping one, whether the lock was still valid then.
type stopSpy struct {
	inner redlease.Keeper
	stops chan bool
}

func (s stopSpy) Keep(lk *redlease.Lock) (stop func()) {
	in := s.inner.Keep(lk)
	return func() {
		s.stops <- lk.Valid()
		in()
	}
}

// A caller leaves while its handler runs (its ctx ends, Do returns at
// once), the handler books, and the store takes no result for longer than
// a lease while a Watchdog keeps the lock (on a Redis of its own) valid.
// Nobody can be told that this outcome went unrecorded, and the caller
// was told it would be recorded: the Barrier keeps trying while the lock
// holds, and once the store takes the result a retry replays it instead
// of booking again. (Found by chaos/sim's effect-twice with
// idem/must-record-left; the retry storm's Consumer saw a payment's
// handler run twice this way.)
//
// Forced order: the handler ends the caller's ctx and returns only once
// Do has returned; every completion (the only requests that carry the
// result) is held at the store's gate. What is left to time is the
// property itself: the Barrier still keeps the lock, trying, half a lease
// past the lease since the handler returned. The lease is 2 s, long
// enough for a starved process to renew it (see
// TestDuplicateDuringSlowRenewedHandler).
func TestUnheardOutcomeIsRecordedWhileItsLockIsKept(t *testing.T) {
	const (
		lease = 2 * time.Second
		mark  = "booked-9d2e" // only the completions carry the result
	)
	probe := redistest.StartStallProbe(t)
	w, err := renew.New()
	require.NoError(t, err)
	defer w.Close()
	spy := stopSpy{inner: w, stops: make(chan bool, 8)}
	srv := redistest.Start(t, redistest.Config{})
	gate := redistest.NewGate(t, srv.Addr)
	locks := redistest.Start(t, redistest.Config{})
	b := barrier(t, failFast(t, gate.Addr), idempotency.WithStrategy(singleOn(t, locks.Client())),
		idempotency.WithKeeper(spy), idempotency.WithLease(lease), idempotency.WithRetention(time.Minute))
	ctx := t.Context()
	// One request first, so that the store knows every script: a held
	// EVALSHA that lands late is applied, not answered NOSCRIPT.
	_, err = b.Do(ctx, idempotency.Request{Key: "warm-up"}, func(context.Context, uint64) ([]byte, error) { return nil, nil })
	require.NoError(t, err)
	require.True(t, redistest.Await(t, probe, spy.stops, lease, 3, "the warm-up run's keeping never stopped"))

	gate.HoldRequests(mark)
	req := idempotency.Request{Key: "book"}
	var runs atomic.Int32
	callerCtx, leave := context.WithCancel(ctx)
	defer leave()
	returned := make(chan struct{})
	var handlerReturned time.Time
	h := func(context.Context, uint64) ([]byte, error) {
		runs.Add(1)
		leave()
		<-returned // Do has returned: the caller left
		handlerReturned = time.Now()
		return []byte(mark), nil
	}
	_, err = b.Do(callerCtx, req, h)
	close(returned)
	require.ErrorIs(t, err, context.Canceled, "the caller left while its handler ran")
	require.NoError(t, gate.WaitHeld(1, mark, lease), "the completion reaches the store's gate")

	// Half a lease past the lease since the handler returned (the bound of
	// a completion's retries while a caller waits): the Barrier still keeps
	// the lock, trying to record.
	time.Sleep(time.Until(handlerReturned.Add(lease * 3 / 2)))
	select {
	case valid := <-spy.stops:
		require.False(t, valid, "the Barrier stopped keeping the lock, still valid, with the outcome unrecorded: a retry will run the handler again")
		t.Fatalf("the lock was lost while the outcome was being recorded: the Watchdog did not renew it for %v (%s)", lease*64/100,
			probe.Explain(lease, 1, handlerReturned, time.Now()))
	default:
	}
	tried := gate.HeldContaining(mark)
	t.Logf("completions held %v after the handler returned: %d", time.Since(handlerReturned).Round(time.Millisecond), tried)

	land(t, gate)
	assert.True(t, redistest.Await(t, probe, spy.stops, 2*lease, 3, "the run never ended once the store took its result"),
		"the run ended with its lock valid, after recording")
	state, err := srv.Client().HGet(ctx, "idem:r:book", "state").Result()
	require.NoError(t, err)
	assert.Equal(t, "c", state, "the outcome is recorded")

	replay, err := b.Do(ctx, req, result(&runs, "booked again"))
	require.NoError(t, err)
	assert.True(t, replay.Replayed, "a retry replays the outcome")
	assert.Equal(t, mark, string(replay.Result))
	assert.EqualValues(t, 1, runs.Load(), "booked once")
}
