package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/renew"
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

func TestFirstRunsDuplicatesReplay(t *testing.T) {
	b := barrier(t, store(t))
	ctx := t.Context()
	req := idempotency.Request{Key: "order:1", Fingerprint: idempotency.Fingerprint("u1", "pay", "100")}
	var runs atomic.Int32
	h := func(ctx context.Context, fence uint64) ([]byte, error) {
		runs.Add(1)
		return []byte(fmt.Sprintf("paid with fence %d", fence)), nil
	}
	first, err := b.Do(ctx, req, h)
	require.NoError(t, err)
	assert.False(t, first.Replayed)
	assert.NotZero(t, first.Fence)
	second, err := b.Do(ctx, req, h)
	require.NoError(t, err)
	assert.True(t, second.Replayed)
	assert.Equal(t, first.Result, second.Result)
	assert.EqualValues(t, 1, runs.Load())
}

// The fingerprint of the first request survives its completion: the same
// key with another payload is refused afterwards, not replayed.
func TestFingerprintSurvivesCompletion(t *testing.T) {
	b := barrier(t, store(t))
	ctx := t.Context()
	ok := func(context.Context, uint64) ([]byte, error) { return []byte("ok"), nil }
	_, err := b.Do(ctx, idempotency.Request{Key: "k", Fingerprint: idempotency.PayloadHash([]byte("amount=100"))}, ok)
	require.NoError(t, err)
	_, err = b.Do(ctx, idempotency.Request{Key: "k", Fingerprint: idempotency.PayloadHash([]byte("amount=999"))}, ok)
	assert.ErrorIs(t, err, idempotency.ErrMismatch)
}

// A handler that outlives its lock finds the request taken over when it
// returns: its result is discarded (its lock was lost: ErrRunCancelled),
// its release leaves the new owner's record alone (ErrNotOwner), and the
// new owner's result stands.
func TestStaleOwnersCompleteIsRejected(t *testing.T) {
	t.Parallel()
	c := store(t)
	b := barrier(t, c, idempotency.WithLease(staleLease), idempotency.WithRetention(time.Minute))
	ctx := t.Context()
	req := idempotency.Request{Key: "transfer:7"}
	probe := redistest.StartStallProbe(t)
	stale := make(chan error, 1)
	started := make(chan struct{})
	takenOver := make(chan struct{}) // closed once the request was taken over (or the test ends)
	var once sync.Once
	endPause := func() { once.Do(func() { close(takenOver) }) }
	defer endPause()
	go func() {
		_, err := b.Do(context.WithoutCancel(ctx), req, func(ctx context.Context, fence uint64) ([]byte, error) {
			close(started)
			<-takenOver // a long pause: the lease runs out and the request is taken over meanwhile
			return []byte("stale"), nil
		})
		stale <- err
	}()
	awaitHandler(t, started, stale)
	waitLockGone(t, probe, c, req.Key) // past the lease: the lock expired
	out, err := b.Do(ctx, req, func(ctx context.Context, fence uint64) ([]byte, error) { return []byte("fresh"), nil })
	endPause()
	require.NoError(t, err, "the request is taken over once its owner's lock expired")
	assert.Equal(t, "fresh", string(out.Result))
	staleErr := <-stale
	assert.ErrorIs(t, staleErr, idempotency.ErrRunCancelled, "the stale owner's result is discarded")
	assert.ErrorIs(t, staleErr, idempotency.ErrNotOwner, "the request was taken over")
	replay, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return nil, errors.New("must not run") })
	require.NoError(t, err)
	assert.Equal(t, "fresh", string(replay.Result))
}

// A caller that does not own a record never deletes it: here the first
// owner outlives its lock, the request is taken over, and the first owner
// then fails transiently — its release must leave the new owner's record
// alone, and the new owner's result stands. The new owner runs through a
// second Barrier on the same prefix with a long lease, so that it holds
// its lock for as long as the test keeps it running (a run that outlives
// its own lock is not recorded).
func TestRecordNeverDeletedByANonOwner(t *testing.T) {
	t.Parallel()
	c := store(t)
	b := barrier(t, c, idempotency.WithLease(staleLease), idempotency.WithRetention(time.Minute))
	long := barrier(t, c, idempotency.WithLease(5*time.Second), idempotency.WithRetention(time.Minute))
	ctx := t.Context()
	req := idempotency.Request{Key: "k"}
	probe := redistest.StartStallProbe(t)
	aDone := make(chan error, 1)
	aStarted := make(chan struct{})
	bRunning := make(chan struct{}) // closed by B's handler (or at the test's end)
	var once sync.Once
	bRan := func() { once.Do(func() { close(bRunning) }) }
	defer bRan()
	go func() {
		_, err := b.Do(context.WithoutCancel(ctx), req, func(context.Context, uint64) ([]byte, error) {
			close(aStarted)
			<-bRunning // A runs on until its lock has expired and B runs
			return nil, errors.New("transient failure, after losing the lock")
		})
		aDone <- err
	}()
	awaitHandler(t, aStarted, aDone)
	waitLockGone(t, probe, c, req.Key) // A's lock has expired
	bFinish := make(chan struct{})
	bDone := make(chan error, 1)
	go func() {
		_, err := long.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			bRan()
			<-bFinish
			return []byte("b"), nil
		})
		bDone <- err
	}()
	awaitHandler(t, bRunning, bDone)
	aErr := <-aDone // A fails and tries to release
	require.ErrorIs(t, aErr, idempotency.ErrRunCancelled, "A's lock was lost while it ran")
	assert.ErrorIs(t, aErr, idempotency.ErrNotOwner, "A's release found B's record")
	n, err := c.Exists(ctx, "idem:r:k").Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n, "B's in-progress record survives A's release")
	close(bFinish)
	require.NoError(t, <-bDone)
	out, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return nil, errors.New("must not run") })
	require.NoError(t, err)
	assert.Equal(t, "b", string(out.Result))
}

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

// claimRefusals is a go-redis hook that sends on refused each time a claim
// (the script sha: ClaimLockHash) is answered with the lock held by
// someone else (a negative integer), without waiting for a receiver.
type claimRefusals struct {
	sha     string
	refused chan<- struct{}
}

func (h claimRefusals) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h claimRefusals) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h claimRefusals) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if args := cmd.Args(); len(args) > 1 && args[1] == h.sha {
			if c, ok := cmd.(*redis.Cmd); ok {
				if v, ok := c.Val().(int64); ok && v < 0 {
					select {
					case h.refused <- struct{}{}:
					default:
					}
				}
			}
		}
		return err
	}
}

// 1,000 concurrent duplicates of 100 requests: each request runs once,
// every caller gets its result (now or replayed) or an in-progress answer.
func TestThousandDuplicatesRunEachOnce(t *testing.T) {
	t.Parallel()
	b := barrier(t, store(t))
	ctx := t.Context()
	var runs [100]atomic.Int32
	var replays, inProgress atomic.Int32
	var wg sync.WaitGroup
	for i := range 1000 {
		wg.Go(func() {
			r := i % 100
			req := idempotency.Request{Key: fmt.Sprintf("req:%d", r), Fingerprint: idempotency.Fingerprint("payload", fmt.Sprint(r))}
			out, err := b.DoWait(ctx, req, 5*time.Second, func(context.Context, uint64) ([]byte, error) {
				runs[r].Add(1)
				time.Sleep(5 * time.Millisecond)
				return []byte(fmt.Sprint(r)), nil
			})
			switch {
			case errors.Is(err, idempotency.ErrInProgress):
				inProgress.Add(1)
			case assert.NoError(t, err):
				assert.Equal(t, fmt.Sprint(r), string(out.Result))
				if out.Replayed {
					replays.Add(1)
				}
			}
		})
	}
	wg.Wait()
	for r := range runs {
		assert.EqualValues(t, 1, runs[r].Load(), "request %d", r)
	}
	t.Logf("1000 calls of 100 requests: 100 runs, %d replays, %d still in progress at the deadline", replays.Load(), inProgress.Load())
}

// Failures: a Final error is stored and replayed; a transient one releases
// the request so a retry runs; a panic releases and re-panics.
func TestResultPolicy(t *testing.T) {
	b := barrier(t, store(t))
	ctx := t.Context()
	insufficient := errors.New("insufficient funds")
	_, err := b.Do(ctx, idempotency.Request{Key: "final"}, func(context.Context, uint64) ([]byte, error) {
		return nil, idempotency.Final(insufficient)
	})
	assert.ErrorIs(t, err, insufficient)
	_, err = b.Do(ctx, idempotency.Request{Key: "final"}, func(context.Context, uint64) ([]byte, error) { return []byte("ran again"), nil })
	var stored *idempotency.StoredError
	require.ErrorAs(t, err, &stored, "a definitive failure is replayed")
	assert.Equal(t, "insufficient funds", stored.Message)

	_, err = b.Do(ctx, idempotency.Request{Key: "transient"}, func(context.Context, uint64) ([]byte, error) {
		return nil, errors.New("db timeout")
	})
	require.Error(t, err)
	out, err := b.Do(ctx, idempotency.Request{Key: "transient"}, func(context.Context, uint64) ([]byte, error) { return []byte("retried"), nil })
	require.NoError(t, err, "a transient failure lets the retry run")
	assert.Equal(t, "retried", string(out.Result))

	assert.Panics(t, func() {
		_, _ = b.Do(ctx, idempotency.Request{Key: "panic"}, func(context.Context, uint64) ([]byte, error) { panic("boom") })
	})
	out, err = b.Do(ctx, idempotency.Request{Key: "panic"}, func(context.Context, uint64) ([]byte, error) { return []byte("after panic"), nil })
	require.NoError(t, err)
	assert.Equal(t, "after panic", string(out.Result))

	all := barrier(t, store(t), idempotency.WithStoreEverything())
	_, _ = all.Do(ctx, idempotency.Request{Key: "t"}, func(context.Context, uint64) ([]byte, error) { return nil, errors.New("db timeout") })
	_, err = all.Do(ctx, idempotency.Request{Key: "t"}, func(context.Context, uint64) ([]byte, error) { return []byte("no"), nil })
	require.ErrorAs(t, err, &stored, "WithStoreEverything replays any outcome")
}

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

func TestRejectsBadInput(t *testing.T) {
	_, err := idempotency.New(nil)
	assert.ErrorIs(t, err, redlease.ErrInvalid)
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	_, err = idempotency.New(c, idempotency.WithLease(time.Hour), idempotency.WithRetention(time.Minute))
	assert.ErrorIs(t, err, redlease.ErrInvalid)
	b := barrier(t, c)
	_, err = b.Do(t.Context(), idempotency.Request{}, func(context.Context, uint64) ([]byte, error) { return nil, nil })
	assert.ErrorIs(t, err, redlease.ErrInvalid)
	_, err = b.Do(t.Context(), idempotency.Request{Key: "k"}, nil)
	assert.ErrorIs(t, err, redlease.ErrInvalid)
}

func TestOneTimeTokens(t *testing.T) {
	tokens, err := idempotency.NewTokens(store(t), "")
	require.NoError(t, err)
	ctx := t.Context()
	tok, err := tokens.Issue(ctx, "form:checkout", 0)
	require.NoError(t, err)
	var ok, used atomic.Int32
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			switch err := tokens.Consume(ctx, "form:checkout", tok); {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, idempotency.ErrTokenUsed):
				used.Add(1)
			default:
				t.Error(err)
			}
		})
	}
	wg.Wait()
	assert.EqualValues(t, 1, ok.Load(), "exactly one consumer succeeds")
	assert.EqualValues(t, 49, used.Load())
	assert.ErrorIs(t, tokens.Consume(ctx, "form:other", tok), idempotency.ErrTokenUnknown, "tokens are scoped")
	assert.ErrorIs(t, tokens.Consume(ctx, "form:checkout", "made-up"), idempotency.ErrTokenUnknown)

	short, err := tokens.Issue(ctx, "form:checkout", 50*time.Millisecond)
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)
	assert.ErrorIs(t, tokens.Consume(ctx, "form:checkout", short), idempotency.ErrTokenExpired)
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
