package idempotency_test

import (
	"context"
	"errors"
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

// A duplicate that arrives while a slow handler runs (its lease renewed
// by the watchdog well past the lease) gets ErrInProgress, not a second
// run; DoWait waits for the result instead.
//
// The handler runs until the test lets it finish, and the test lets it
// finish only once DoWait has been told "in progress" (seen by a hook on
// the store's client): no sleep decides the order. What is left to time is
// the property itself, renewal past the lease, and the lease is long
// enough for a starved process: a renewal is taken a quarter of the lease
// after the previous one started and must land before the lock counts as
// lost (Until less the loss margin, about 0.89 of the lease after that
// start), so the process may stall for about 0.64 of the lease. Under
// load (-race, two busy loops beside it, other tests on the machine) the
// lock was lost in 8 of 120 runs with a lease of 300 ms (190 ms of stall)
// and in 2 of 100 with 1 s (640 ms), and a 5 ms timer in the test process
// fired up to 600 ms late; 2 s leaves 1.28 s.
func TestDuplicateDuringSlowRenewedHandler(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	const lease = 2 * time.Second
	w, err := renew.New()
	require.NoError(t, err)
	defer w.Close()
	c := store(t)
	held := make(chan struct{}, 16)
	c.AddHook(claimRefusals{sha: idempotency.ClaimLockHash(), refused: held})
	ctx := t.Context()
	require.NoError(t, idempotency.LoadScripts(ctx, c), "EVALSHA finds the claim: the hook sees every one")
	b := barrier(t, c, idempotency.WithLease(lease), idempotency.WithKeeper(w))
	req := idempotency.Request{Key: "slow"}
	var runs atomic.Int32
	started := make(chan time.Time, 1)
	finish := make(chan struct{})
	h := func(ctx context.Context, fence uint64) ([]byte, error) {
		if runs.Add(1) > 1 {
			return []byte("ran again"), nil // at once: the test fails without waiting for this run
		}
		started <- time.Now()
		select {
		case <-finish:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		return []byte("done"), nil
	}
	first := make(chan error, 1)
	go func() { _, err := b.Do(ctx, req, h); first <- err }()
	var begun time.Time
	select {
	case begun = <-started:
	case err := <-first:
		t.Fatalf("the first request ended before its handler ran: %v", err)
	}
	// Half a lease past the lease since the grant (which came before the
	// handler started): only renewal keeps the request in flight.
	time.Sleep(time.Until(begun.Add(lease * 3 / 2)))
	_, err = b.Do(ctx, req, h)
	var inProgress *idempotency.InProgressError
	require.ErrorAs(t, err, &inProgress, "in flight past its lease; if not, no renewal landed for 0.64 of the lease (%v): a stalled process, or renewals that stopped", lease*64/100)
	assert.GreaterOrEqual(t, inProgress.RetryAfter, time.Second)
	redistest.Await(t, probe, held, 10*lease, 3, "the duplicate's in-progress answer came without a refused claim") // the duplicate's claim, refused

	type waited struct {
		out idempotency.Outcome
		err error
	}
	second := make(chan waited, 1)
	go func() {
		out, err := b.DoWait(ctx, req, 10*lease, h)
		second <- waited{out, err}
	}()
	select {
	case <-held: // DoWait found the request in flight: it waits for it
	case got := <-second:
		t.Fatalf("DoWait returned before the handler finished: %+v, %v", got.out, got.err)
	}
	close(finish)
	got := <-second
	require.NoError(t, got.err)
	assert.True(t, got.out.Replayed)
	assert.Equal(t, "done", string(got.out.Result))
	require.NoError(t, <-first)
	assert.EqualValues(t, 1, runs.Load())
}

// untilDone is a handler body that waits for its ctx to end, or fails the
// run if it has not ended within 5 s plus 3 × what probe measured this
// process stalled meanwhile.
func untilDone(ctx context.Context, t *testing.T, probe *redistest.StallProbe) error {
	soft := &redistest.SoftTB{TB: t}
	redistest.Await(soft, probe, ctx.Done(), 5*time.Second, 3, "the handler's ctx never ended")
	if soft.Failed() != "" {
		return errors.New(soft.Failed())
	}
	return nil
}

// A handler whose lock is lost while it runs, and that returns a result
// anyway (it did not look at its ctx in time): its outcome is unknown, so
// nothing is recorded, the record is released, and the retry runs.
func TestRunWithALostLockIsNotRecorded(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	b := barrier(t, store(t), idempotency.WithLease(200*time.Millisecond), idempotency.WithRetention(time.Minute))
	ctx := t.Context()
	req := idempotency.Request{Key: "lost-lock"}
	var runs atomic.Int32
	out, err := b.Do(ctx, req, func(ctx context.Context, fence uint64) ([]byte, error) {
		runs.Add(1)
		if err := untilDone(ctx, t, probe); err != nil { // no Keeper: the lock is lost at the end of the lease
			return nil, err
		}
		return []byte("partial"), nil
	})
	t.Logf("%v", err)
	assert.ErrorIs(t, err, idempotency.ErrRunCancelled)
	assert.ErrorIs(t, err, redlease.ErrLost, "context.Cause: the lock was lost")
	assert.Nil(t, out.Result, "an unknown outcome is not handed out as a result")

	out, err = b.Do(ctx, req, result(&runs, "complete"))
	require.NoError(t, err, "the retry runs")
	assert.False(t, out.Replayed, "the cancelled run was not recorded")
	assert.Equal(t, "complete", string(out.Result))
	assert.EqualValues(t, 2, runs.Load())
}

// WithStoreEverything stores every outcome of a run — but a run aborted by
// the loss of its lock has no outcome: its "context canceled" must not be
// replayed forever.
func TestStoreEverythingDoesNotStoreARunAbortedByItsLostLock(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	b := barrier(t, store(t), idempotency.WithStoreEverything(),
		idempotency.WithLease(200*time.Millisecond), idempotency.WithRetention(time.Minute))
	ctx := t.Context()
	req := idempotency.Request{Key: "aborted"}
	var runs atomic.Int32
	_, err := b.Do(ctx, req, func(ctx context.Context, fence uint64) ([]byte, error) {
		runs.Add(1)
		if err := untilDone(ctx, t, probe); err != nil {
			return nil, err
		}
		return nil, ctx.Err() // what a handler that honours its ctx returns
	})
	assert.ErrorIs(t, err, idempotency.ErrRunCancelled)
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorIs(t, err, redlease.ErrLost, "context.Cause says why")

	out, err := b.Do(ctx, req, result(&runs, "done"))
	require.NoError(t, err, "not a replay of the aborted run")
	assert.False(t, out.Replayed)
	assert.Equal(t, "done", string(out.Result))
	assert.EqualValues(t, 2, runs.Load())
}

// The store pauses (SIGSTOP) as the handler starts, with a store client
// on go-redis's default options (no ContextTimeoutEnabled: a call to a
// paused server waits for its 3 s read timeout and retries). The
// request's lock cannot be renewed, so it is lost: the handler must be
// told (its ctx cancelled with ErrLost) before the lock's validity could
// have ended — before Do's start plus the lease — whatever the record's
// renewal, stuck on the same store, is doing. Otherwise a successor could
// be granted the request while this handler still believes it runs alone.
func TestHandlerIsToldOfALostLockWhileTheStoreHangs(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	srv, c := defaultClientStore(t)
	const lease = 900 * time.Millisecond
	b := barrier(t, c, idempotency.WithLease(lease), idempotency.WithRetention(time.Minute))

	start := time.Now()
	var told time.Time
	var cause error
	_, err := b.Do(t.Context(), idempotency.Request{Key: "pay:1"}, func(ctx context.Context, _ uint64) ([]byte, error) {
		srv.Pause()
		// Told by the lease's end, or as much later as stallMultiple
		// times this process's measured stall (bounded: 10 ms a round).
		for range 10_000 {
			if ctx.Err() != nil || time.Since(start) > probe.Allowance(lease, stallMultiple, start, time.Now()) {
				break
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
		if ctx.Err() != nil {
			told, cause = time.Now(), context.Cause(ctx)
		}
		srv.Resume()
		return []byte("paid"), nil
	})
	require.False(t, told.IsZero(), "the handler was not told that its lock was lost: %s", probe.Explain(lease, stallMultiple, start, time.Now()))
	assert.ErrorIs(t, cause, redlease.ErrLost)
	// Past the lease the store may already grant the request to another
	// run: the handler is told before, unless this process could not run
	// a timer for at least as long as the overrun (the documented limit),
	// measured from 0.8 of the lease (the lock's deadline is no earlier:
	// Until less the loss margin, a tenth of the lease, and the drift
	// allowance) to the notice.
	if over := told.Sub(start) - lease; over >= 0 {
		stall := probe.Worst(start.Add(lease*8/10), told)
		if stall < over {
			t.Errorf("the handler was told %v after Do began: past the lease (%v), when the store may already grant the request to another run, while this process's timers were at most %v late", told.Sub(start), lease, stall)
		} else {
			t.Logf("the handler was told %v past the lease, during a measured stall of %v", over, stall)
		}
	}
	assert.True(t, errors.Is(err, idempotency.ErrRunCancelled), "Do: %v", err)
}

// Found by the simulator (barrier scenario, seed 15380, with the
// handler-overlap invariant). A's claim of the record is applied while its
// lock is valid, but the reply comes back only after the lock ran out and
// B took the request over and started its handler. A must not start its
// handler then: its lock is gone, and B runs. Forced order: the reply to
// A's claim is held in a gate until B's handler runs.
func TestNoHandlerStartsAfterItsLockRanOut(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	gate := redistest.NewGate(t, srv.Addr)
	slow := redis.NewClient(&redis.Options{Addr: gate.Addr, ReadTimeout: 30 * time.Second})
	t.Cleanup(func() { _ = slow.Close() })
	const lease = 300 * time.Millisecond
	// 61 s of retention: "61000" is in A's claim (not in its peek).
	a := barrier(t, slow, idempotency.WithLease(lease), idempotency.WithRetention(61*time.Second))
	b := barrier(t, srv.Client(), idempotency.WithLease(lease), idempotency.WithRetention(61*time.Second))
	ctx := t.Context()
	req := idempotency.Request{Key: "settle:9"}
	fenceFromZero(t, srv.Client(), requestLock("idem:", req.Key))

	// Load the scripts first (a first EVALSHA answers NOSCRIPT).
	_, err := a.Do(ctx, idempotency.Request{Key: "warm-up"}, func(context.Context, uint64) ([]byte, error) { return nil, nil })
	require.NoError(t, err)

	gate.HoldReplies("61000")
	aStarted := make(chan struct{}, 1)
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			aStarted <- struct{}{}
			return []byte("a"), nil
		})
		aDone <- err
	}()
	require.NoError(t, gate.WaitHeld(1, claimedFence1, 5*time.Second), "the reply to A's claim is held")
	gate.HoldReplies("")

	var bOut idempotency.Outcome
	for range 100 {
		bOut, err = b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			gate.Open() // A learns it claimed the record, long after its lock ran out
			var aErr error
			returned := false
			soft := &redistest.SoftTB{TB: t}
			probe.WaitFor(soft, 2*time.Second, 3, time.Millisecond, func() bool {
				select {
				case aErr = <-aDone:
					returned = true
				default:
				}
				return returned
			}, "A's Do did not return after its claim's reply")
			if returned {
				aDone <- aErr
			} else {
				t.Error(soft.Failed())
			}
			return []byte("b"), nil
		})
		if !errors.Is(err, idempotency.ErrInProgress) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, err)
	assert.Equal(t, "b", string(bOut.Result))
	select {
	case <-aStarted:
		t.Error("A's handler started after its lock ran out, while B's ran")
	default:
	}
	aErr := <-aDone
	t.Logf("A: %v", aErr)
	assert.ErrorIs(t, aErr, idempotency.ErrInProgress, "A: nothing ran; B has the request")
}

// Found by the simulator (TestFindingBarrierNotOwnerAfterEffect, seed 10542
// of its barrier scenario). The handler ran and succeeded, but its result
// reached the store only after its lease ran out and another caller had
// taken the request over: the store refuses it (not the owner). The
// effect happened, so Do must say ErrNotRecorded ("do not run it again"),
// not a bare ErrNotOwner ("nothing ran, redeliver"). Forced order: A's
// result is held in a gate until B has taken over and finished.
func TestResultRefusedAfterTakeoverIsNotRecordedNotFailed(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	gate := redistest.NewGate(t, srv.Addr)
	slow := redis.NewClient(&redis.Options{Addr: gate.Addr, ReadTimeout: 30 * time.Second}) // waits for the held reply
	t.Cleanup(func() { _ = slow.Close() })
	const lease = 300 * time.Millisecond
	a := barrier(t, slow, idempotency.WithLease(lease), idempotency.WithRetention(time.Minute))
	b := barrier(t, srv.Client(), idempotency.WithLease(lease), idempotency.WithRetention(time.Minute))
	ctx := t.Context()
	req := idempotency.Request{Key: "charge:7"}

	gate.HoldRequests("charged by a") // A's result, on its way to the store
	type done struct {
		out idempotency.Outcome
		err error
	}
	aDone := make(chan done, 1)
	go func() {
		out, err := a.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte("charged by a"), nil })
		aDone <- done{out, err}
	}()
	require.NoError(t, gate.WaitHeld(1, "charged by a", 5*time.Second), "A's result is held")

	// A's lease runs out; B takes the request over and runs it.
	var bOut idempotency.Outcome
	var err error
	for range 100 {
		bOut, err = b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte("charged by b"), nil })
		if !errors.Is(err, idempotency.ErrInProgress) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, err)
	assert.Equal(t, "charged by b", string(bOut.Result))

	require.NoError(t, gate.Step("charged by a", 5*time.Second)) // A's result lands: refused
	gate.Open()
	d := redistest.Await(t, probe, aDone, 10*time.Second, 3, "A's Do did not return")
	t.Logf("A: %v", d.err)
	require.ErrorIs(t, d.err, idempotency.ErrNotRecorded, "the handler ran: its effect happened, unrecorded")
	// And why: the store refused it (taken over), or — A's store calls end
	// with its lock's validity, whatever the client's read timeout — no
	// reply came before then and the result may still land (refused).
	assert.True(t, errors.Is(d.err, idempotency.ErrNotOwner) || errors.Is(d.err, context.DeadlineExceeded), "and why: %v", d.err)
	assert.Equal(t, "charged by a", string(d.out.Result))
}

// A run whose lock was lost is reported in one line, with every cause
// reachable by errors.Is: the cancelled run, the loss, the handler's own
// error.
func TestRunCancelledErrorIsOneLine(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	b := barrier(t, srv.Client(), idempotency.WithLease(300*time.Millisecond), idempotency.WithRetention(time.Minute))
	_, err := b.Do(t.Context(), idempotency.Request{Key: "oneline"}, func(ctx context.Context, _ uint64) ([]byte, error) {
		<-ctx.Done() // the lease runs out: the lock is lost
		return nil, ctx.Err()
	})
	require.ErrorIs(t, err, idempotency.ErrRunCancelled)
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotContains(t, err.Error(), "\n", "one line")
	t.Log(err)
}

// A handler whose lock a Keeper renews past the retention keeps its
// in-progress record for as long: the record is not lost to its TTL (set
// once at claim), a duplicate meanwhile is told "in progress", the result
// is stored, and the handler runs once. The lease is 2 s: the watchdog's
// renewals then ride out a stall of about 0.64 of it (see
// TestDuplicateDuringSlowRenewedHandler); with 300 ms the lock was lost
// ("validity ran out without an extension") in a -race run beside other
// tests at load 9.
func TestRenewedHandlerOutlivingTheRetentionKeepsItsRecord(t *testing.T) {
	w, err := renew.New()
	require.NoError(t, err)
	defer w.Close()
	c := store(t)
	const (
		lease     = 2 * time.Second
		retention = lease + lease/4
	)
	b := barrier(t, c, idempotency.WithLease(lease), idempotency.WithRetention(retention), idempotency.WithKeeper(w))
	ctx := t.Context()
	req := idempotency.Request{Key: "long"}
	var runs atomic.Int32
	running := make(chan struct{}, 1)
	h := func(ctx context.Context, fence uint64) ([]byte, error) {
		runs.Add(1)
		select {
		case running <- struct{}{}:
		default:
		}
		select {
		case <-time.After(retention * 3 / 2):
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		return []byte("booked"), nil
	}
	type done struct {
		out idempotency.Outcome
		err error
	}
	first := make(chan done, 1)
	go func() {
		out, err := b.Do(ctx, req, h)
		first <- done{out, err}
	}()
	<-running
	time.Sleep(retention * 6 / 5) // past the TTL the record was claimed with

	n, err := c.Exists(ctx, "idem:r:long").Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "the in-progress record outlives the retention while its lock is held")
	_, err = b.Do(ctx, req, h)
	assert.ErrorIs(t, err, idempotency.ErrInProgress, "a duplicate meanwhile does not run")

	got := <-first
	require.NoError(t, got.err, "the result is stored")
	assert.Equal(t, "booked", string(got.out.Result))
	out, err := b.Do(ctx, req, h)
	require.NoError(t, err)
	assert.True(t, out.Replayed, "a duplicate afterwards gets the stored result")
	assert.EqualValues(t, 1, runs.Load(), "the handler ran once")
}
