package idempotency_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/internal/wake"
	"github.com/redlease/redlease/single"
)

// The default Barrier on a one-Redis store (its lock on the store, single
// strategy) runs a request's steps as two scripts: peek+lock+claim, then
// complete (which leaves the lock to expire). These tests force the
// orders of events those two scripts create: a reply of either lost after
// the server applied it, a grant that comes back with too little
// validity, a late completion that lands after a successor took the
// request over, and duplicates between the two scripts.

// requestLock is the Redis key of the in-flight lock of Do's request key
// under prefix (see keys.go: prefix+"l:"+32 hex digits of SHA-256 of
// "r:"+key).
func requestLock(prefix, key string) string {
	sum := sha256.Sum256([]byte("r:" + key))
	return prefix + "l:" + hex.EncodeToString(sum[:16])
}

// fenceOf is the fence counter of a lock key (script.FenceKey for a key
// without braces).
func fenceOf(lockKey string) string { return "redlease:fence:{" + lockKey + "}" }

// fenceFromZero creates lockKey's fence counter at 0 (with a TTL), so that
// its next grants take fences 1, 2, ... (a counter created anew by a grant
// starts from the server's clock instead), for a test that matches a fence
// on the wire.
func fenceFromZero(t *testing.T, c *redis.Client, lockKey string) {
	t.Helper()
	require.NoError(t, c.Set(t.Context(), fenceOf(lockKey), "0", time.Minute).Err())
}

// during returns how many commands h saw sent while f ran: round trips,
// for a Barrier, which sends no pipelines.
func during(h *countingHook, f func()) int32 {
	before := h.n.Load()
	f()
	return h.n.Load() - before
}

// loseReplies is a hook that lets the server apply a command that has an
// argument equal to match and then loses its reply, the first n times: the
// caller gets an I/O error, as when the connection breaks after the
// request went out. go-redis does not retry it (the hook is outside its
// retries), so exactly the first n such commands are applied unseen.
type loseReplies struct {
	match string
	n     atomic.Int32
	sent  atomic.Int32 // commands with the match sent, lost or not
}

func (h *loseReplies) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *loseReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if !hasArg(cmd, h.match) {
			return err
		}
		h.sent.Add(1)
		if err == nil && h.n.Add(-1) >= 0 {
			lost := fmt.Errorf("reply lost (injected): %w", io.ErrUnexpectedEOF)
			cmd.SetErr(lost)
			return lost
		}
		return err
	}
}

func (h *loseReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func hasArg(cmd redis.Cmder, s string) bool {
	for _, a := range cmd.Args() {
		if b, ok := a.([]byte); ok {
			a = string(b)
		}
		if fmt.Sprint(a) == s {
			return true
		}
	}
	return false
}

// hookedClient is a ContextTimeoutEnabled client to srv with hook.
func hookedClient(t *testing.T, srv *redistest.Server, hook redis.Hook) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	c.AddHook(hook)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// warm loads the scripts of the package and of the single strategy into
// the server's script cache, so that no later call pays a NOSCRIPT round
// trip.
func warm(t *testing.T, c *redis.Client) {
	t.Helper()
	require.NoError(t, idempotency.LoadScripts(t.Context(), c))
	sep := barrier(t, c, idempotency.WithStrategy(singleOn(t, c)), idempotency.WithPrefix("warm-up:"))
	_, err := sep.Do(t.Context(), idempotency.Request{Key: "warm-up"}, func(context.Context, uint64) ([]byte, error) { return []byte("ok"), nil })
	require.NoError(t, err)
}

// gatedStore starts a store with a gate in front of it, and returns it,
// the gate, a client through the gate (no retries) and one straight to
// the store, the scripts loaded (warm).
func gatedStore(t *testing.T) (srv *redistest.Server, gate *redistest.Gate, slow, fast *redis.Client) {
	t.Helper()
	srv = redistest.Start(t, redistest.Config{})
	gate = redistest.NewGate(t, srv.Addr)
	slow = redis.NewClient(&redis.Options{Addr: gate.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = slow.Close() })
	fast = srv.Client()
	warm(t, fast)
	return srv, gate, slow, fast
}

// A first request costs two round trips (peek+lock+claim, complete),
// a replay one, a duplicate while the first runs one; the handler still
// gets a fence and a lock that a Keeper-less run loses at its lease. A
// Barrier given a strategy (here single on the same store, explicitly)
// keeps the five separate steps.
func TestFirstRequestTakesTwoRoundTrips(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	rt := &countingHook{}
	c := hookedClient(t, srv, rt)
	b := barrier(t, c)
	warm(t, c)
	ctx := t.Context()

	var fence uint64
	running, finish := make(chan struct{}), make(chan struct{})
	firstDone := make(chan error, 1)
	var first int32
	go func() {
		var err error
		first = during(rt, func() {
			_, err = b.Do(ctx, idempotency.Request{Key: "pay:1"}, func(hctx context.Context, f uint64) ([]byte, error) {
				fence = f
				close(running)
				<-finish
				return []byte("paid"), nil
			})
		})
		firstDone <- err
	}()
	<-running
	// The duplicate's round trip is counted apart from the first's:
	// nothing else is sent while the first request's handler waits.
	var dupErr error
	dup := during(rt, func() {
		_, dupErr = b.Do(ctx, idempotency.Request{Key: "pay:1"}, func(context.Context, uint64) ([]byte, error) {
			t.Error("a duplicate ran while the first request ran")
			return nil, nil
		})
	})
	close(finish)
	require.NoError(t, <-firstDone)
	require.ErrorIs(t, dupErr, idempotency.ErrInProgress)
	assert.EqualValues(t, 1, dup, "a duplicate while the first runs: one round trip")
	assert.EqualValues(t, 3, first, "first request, counting the duplicate's round trip sent meanwhile: 2 + 1")
	assert.NotZero(t, fence)

	var out idempotency.Outcome
	var err error
	replay := during(rt, func() { out, err = b.Do(ctx, idempotency.Request{Key: "pay:1"}, mustReplay) })
	require.NoError(t, err)
	assert.True(t, out.Replayed)
	assert.Equal(t, "paid", string(out.Result))
	assert.EqualValues(t, 1, replay, "a replay: one round trip")

	alone := during(rt, func() {
		_, err = b.Do(ctx, idempotency.Request{Key: "pay:2", Fingerprint: "fp-a"}, func(context.Context, uint64) ([]byte, error) { return []byte("ok"), nil })
	})
	require.NoError(t, err)
	assert.EqualValues(t, 2, alone, "a first request alone: two round trips")

	mismatch := during(rt, func() {
		_, err = b.Do(ctx, idempotency.Request{Key: "pay:2", Fingerprint: "fp-b"}, mustReplay)
	})
	assert.ErrorIs(t, err, idempotency.ErrMismatch)
	assert.EqualValues(t, 1, mismatch, "a mismatch: one round trip")

	// Any other strategy keeps today's separate steps.
	sep := barrier(t, c, idempotency.WithStrategy(singleOn(t, c, single.WithFenceTTL(idempotency.DefaultRetention+idempotency.DefaultLease))))
	alone = during(rt, func() {
		_, err = sep.Do(ctx, idempotency.Request{Key: "pay:3"}, func(context.Context, uint64) ([]byte, error) { return []byte("ok"), nil })
	})
	require.NoError(t, err)
	assert.EqualValues(t, 5, alone, "with a strategy of its own: peek, acquire, claim, complete, release")
}

// mustReplay is a handler for calls that must replay: it is never run.
func mustReplay(context.Context, uint64) ([]byte, error) {
	return nil, errors.New("ran: this call should have replayed")
}

// The combined claim is applied (lock taken, record claimed, fence
// raised) but its reply is lost. The attempt undoes both by its own token
// before Do returns: a retry runs at once instead of waiting out the
// lease, and its fence is above the lost attempt's.
func TestClaimWhoseReplyIsLostIsUndoneByItsToken(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	const retention = 61 * time.Second
	lose := &loseReplies{match: "61000"} // ARGV of the claim (and the completion), not of the undo
	c := hookedClient(t, srv, lose)
	b := barrier(t, c, idempotency.WithRetention(retention))
	warm(t, c)
	admin := srv.Client()
	ctx := t.Context()
	req := idempotency.Request{Key: "pay:lost-claim"}
	lock := requestLock("idem:", req.Key)
	fenceFromZero(t, admin, lock)

	lose.n.Store(1)
	_, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
		t.Error("the handler ran without the claim's reply")
		return nil, nil
	})
	require.Error(t, err)
	assert.ErrorIs(t, err, redlease.ErrUnavailable, "the store's reply was lost: a failure, not a refusal")
	assert.NotErrorIs(t, err, idempotency.ErrInProgress)
	assert.EqualValues(t, 1, lose.sent.Load(), "one claim sent")
	fence, ferr := admin.Get(ctx, fenceOf(lock)).Int()
	require.NoError(t, ferr)
	assert.Equal(t, 1, fence, "the lost claim was applied: it took fence 1")
	assert.Zero(t, admin.Exists(ctx, lock).Val(), "the lock the lost claim took was undone")
	assert.Zero(t, admin.Exists(ctx, "idem:r:"+req.Key).Val(), "the record the lost claim made was undone")

	out, err := b.Do(ctx, req, func(_ context.Context, f uint64) ([]byte, error) { return []byte("paid"), nil })
	require.NoError(t, err, "the retry runs at once")
	assert.False(t, out.Replayed)
	assert.EqualValues(t, 2, out.Fence, "above the lost attempt's fence")
}

// claimedFence1 is the claim's reply on the wire when it took the lock
// with fence 1 and claimed the record: the integer 1.
const claimedFence1 = ":1\r\n"

// The same with go-redis's default client options, through a gate: the
// claim's reply is held, Do returns at its ctx (the call is abandoned),
// and when the reply finally comes the abandoned attempt undoes itself —
// by its own token, so it does not remove a lock or a record of anyone
// else's.
func TestAbandonedClaimUndoesItselfWhenItsReplyComes(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	gate := redistest.NewGate(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: gate.Addr}) // default options: no ContextTimeoutEnabled
	t.Cleanup(func() { _ = c.Close() })
	b := barrier(t, c, idempotency.WithRetention(61*time.Second))
	warm(t, c)
	admin := srv.Client()
	req := idempotency.Request{Key: "pay:abandoned"}
	lock := requestLock("idem:", req.Key)
	fenceFromZero(t, admin, lock)

	gate.HoldReplies("61000")
	dctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := b.Do(dctx, req, func(context.Context, uint64) ([]byte, error) {
		t.Error("the handler ran without the claim's reply")
		return nil, nil
	})
	require.Error(t, err)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, gate.WaitHeld(1, claimedFence1, 5*time.Second), "the claim was applied; its reply is held")
	ctx := t.Context()
	held, gerr := admin.Get(ctx, lock).Result()
	require.NoError(t, gerr, "the abandoned claim holds the lock")
	assert.Equal(t, "p", admin.HGet(ctx, "idem:r:"+req.Key, "state").Val())

	// The reply comes; the abandoned attempt then sends its undo, which the
	// gate holds until the test has looked.
	gate.HoldReplies("")
	gate.HoldRequests("redlease:queue:") // the undo names the lock's line
	require.NoError(t, gate.Step(claimedFence1, 5*time.Second))
	require.NoError(t, gate.WaitHeld(1, "redlease:queue:", 5*time.Second), "the abandoned claim sent its undo")
	assert.Equal(t, 1, gate.HeldContaining(held), "the undo names the attempt's own token")
	require.NoError(t, gate.Step("redlease:queue:", 5*time.Second))
	gate.Open()
	assert.Zero(t, admin.Exists(ctx, lock).Val(), "the lock the abandoned claim took was undone")
	assert.Zero(t, admin.Exists(ctx, "idem:r:"+req.Key).Val(), "the record it made was undone")

	out, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte("paid"), nil })
	require.NoError(t, err, "the retry runs at once")
	assert.EqualValues(t, 2, out.Fence)
}

// The completion is applied but its reply is lost. Its retry finds the
// record completed by this owner: the outcome is recorded (no
// ErrNotRecorded, which would tell the caller its effect may have
// happened unseen), the lock is left to expire within the lease, and a
// duplicate replays.
func TestCompletionWhoseReplyIsLostIsConfirmedByItsRetry(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	lose := &loseReplies{match: "receipt:lost-completion"}
	c := hookedClient(t, srv, lose)
	b := barrier(t, c)
	warm(t, c)
	admin := srv.Client()
	ctx := t.Context()
	req := idempotency.Request{Key: "pay:lost-completion"}

	lose.n.Store(1)
	var runs atomic.Int32
	out, err := b.Do(ctx, req, result(&runs, "receipt:lost-completion"))
	require.NoError(t, err, "the retry of the completion confirmed it")
	assert.Equal(t, "receipt:lost-completion", string(out.Result))
	assert.False(t, out.Replayed)
	assert.EqualValues(t, 2, lose.sent.Load(), "the completion was sent twice: its reply was lost once")
	left, err := admin.PTTL(ctx, requestLock("idem:", req.Key)).Result()
	require.NoError(t, err)
	assert.True(t, left > 0 && left <= idempotency.DefaultLease, "the lock is left to expire within the lease: PTTL %v", left)
	assert.Equal(t, "c", admin.HGet(ctx, "idem:r:"+req.Key, "state").Val())

	replay, err := b.Do(ctx, req, result(&runs, "again"))
	require.NoError(t, err)
	assert.True(t, replay.Replayed)
	assert.Equal(t, "receipt:lost-completion", string(replay.Result))
	assert.EqualValues(t, 1, runs.Load())
}

// A's handler returns in time, but its completion reaches the store only
// after A's lock ran out and B took the request over: held in a gate
// until B's handler runs. It must neither store A's result over B's record
// nor remove B's lock (the completion compares the record's owner, and
// touches no lock). A hears that its outcome was not recorded (its effect
// may have happened); B's run goes on under a lock that is still there,
// and its result is the one recorded.
func TestLateCompletionNeverRemovesASuccessorsLock(t *testing.T) {
	srv, gate, slow, fast := gatedStore(t)
	const lease = 300 * time.Millisecond
	a := barrier(t, slow, idempotency.WithLease(lease), idempotency.WithRetention(time.Minute))
	b := barrier(t, fast, idempotency.WithLease(lease), idempotency.WithRetention(time.Minute))
	admin := srv.Client()
	ctx := t.Context()
	req := idempotency.Request{Key: "settle:late"}
	lock := requestLock("idem:", req.Key)

	gate.HoldRequests("from-A") // A's completions: they carry A's result
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte("from-A"), nil })
		aDone <- err
	}()
	require.NoError(t, gate.WaitHeld(1, "from-A", 5*time.Second), "A's completion is held")

	var bOut idempotency.Outcome
	var err error
	bRan := false
	for range 100 { // B's lock comes when A's runs out: at most a lease
		bOut, err = b.Do(ctx, req, func(hctx context.Context, fence uint64) ([]byte, error) {
			bRan = true
			bToken, gerr := admin.Get(ctx, lock).Result()
			assert.NoError(t, gerr, "B holds the lock")
			// Now A's completions land, however many A sent.
			gate.HoldRequests("")
			for gate.HeldContaining("from-A") > 0 {
				if !assert.NoError(t, gate.Step("from-A", 5*time.Second)) {
					break
				}
			}
			got, gerr := admin.Get(ctx, lock).Result()
			assert.NoError(t, gerr, "B's lock is still there after A's late completion")
			assert.Equal(t, bToken, got, "B's lock still holds B's token")
			assert.NoError(t, hctx.Err(), "B's run goes on")
			assert.Equal(t, "p", admin.HGet(ctx, "idem:r:"+req.Key, "state").Val(), "A's result was not stored over B's record")
			assert.Equal(t, fmt.Sprint(fence), admin.HGet(ctx, "idem:r:"+req.Key, "fence").Val(), "the record is B's")
			return []byte("from-B"), nil
		})
		if bRan || !errors.Is(err, idempotency.ErrInProgress) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.True(t, bRan, "B never got the request: %v", err)
	require.NoError(t, err)
	assert.Equal(t, "from-B", string(bOut.Result))
	aErr := <-aDone
	t.Logf("A: %v", aErr)
	assert.ErrorIs(t, aErr, idempotency.ErrNotRecorded, "A ran; its outcome was not recorded")

	replay, err := b.Do(ctx, req, mustReplay)
	require.NoError(t, err)
	assert.True(t, replay.Replayed)
	assert.Equal(t, "from-B", string(replay.Result))
}

// During a rolling upgrade, processes that run the two combined scripts
// and processes that run the five separate steps share a store: the same
// lock key, fence counter and record. (A Barrier with an explicit single
// strategy on the store runs the separate steps, as every Barrier did
// before.) They exclude each other, each replays the other's result, and
// fences rise across them.
func TestCombinedAndSeparateStepsShareRequests(t *testing.T) {
	c := store(t)
	combined := barrier(t, c)
	separate := barrier(t, c, idempotency.WithStrategy(singleOn(t, c, single.WithFenceTTL(idempotency.DefaultRetention+idempotency.DefaultLease))))
	ctx := t.Context()
	for i, pair := range [][2]*idempotency.Barrier{{combined, separate}, {separate, combined}} {
		holder, other := pair[0], pair[1]
		req := idempotency.Request{Key: fmt.Sprintf("pay:mixed:%d", i), Fingerprint: "fp"}
		// A first run of the other kind that fails (not stored) takes the
		// first fence (from the server's clock: a counter created anew).
		_, err := other.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return nil, errors.New("transient") })
		require.EqualError(t, err, "transient")
		first, err := c.Get(ctx, fenceOf(requestLock("idem:", req.Key))).Uint64()
		require.NoError(t, err)
		out, err := holder.Do(ctx, req, func(hctx context.Context, fence uint64) ([]byte, error) {
			_, derr := other.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
				t.Errorf("pair %d: the other kind ran while the holder ran", i)
				return nil, nil
			})
			assert.ErrorIs(t, derr, idempotency.ErrInProgress, "pair %d", i)
			_, derr = other.Do(ctx, idempotency.Request{Key: req.Key, Fingerprint: "other fp"}, mustReplay)
			assert.ErrorIs(t, derr, idempotency.ErrMismatch, "pair %d", i)
			return []byte(fmt.Sprint("paid ", fence)), nil
		})
		require.NoError(t, err)
		assert.Equal(t, first+1, out.Fence, "pair %d: fences rise across runs of either kind", i)
		replay, err := other.Do(ctx, req, mustReplay)
		require.NoError(t, err)
		assert.True(t, replay.Replayed)
		assert.Equal(t, fmt.Sprint("paid ", first+1), string(replay.Result))
	}
}

// On a Cluster a record and its lock live in different slots, which one
// script may not touch together: a Barrier on a Cluster client keeps the
// separate steps (one key each) and works as before.
func TestBarrierOnAClusterKeepsSeparateSteps(t *testing.T) {
	t.Parallel()
	cc := redistest.ClusterClient(t, redistest.StartCluster(t, 3))
	b := barrier(t, cc)
	ctx := t.Context()
	for i := range 5 { // keys spread over the masters
		req := idempotency.Request{Key: fmt.Sprintf("pay:cluster:%d", i), Fingerprint: "fp"}
		var runs atomic.Int32
		out, err := b.Do(ctx, req, result(&runs, "paid"))
		require.NoError(t, err, "request %d", i)
		assert.NotZero(t, out.Fence)
		replay, err := b.Do(ctx, req, result(&runs, "again"))
		require.NoError(t, err)
		assert.True(t, replay.Replayed)
		assert.EqualValues(t, 1, runs.Load())
	}
}

// A completed request leaves its lock to expire (Barrier.leavesLock):
// the lock key still holds the run's token, for at most the lease, and it
// stands in nobody's way, since every claim reads the record first and a
// completed record answers by itself: a duplicate right after the
// completion replays at once, in one round trip, without the handler. A
// record deleted by hand after its completion leaves the key in progress
// until the lock expires, as documented. The undo of a claim whose reply
// was lost releases its lock at once, and says so on the lock's wake
// channel (wake.UndoNotice). Forced order: a subscriber confirmed before
// the request.
func TestCompletionLeavesTheLockAndAnUndoSaysUndo(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	const retention = 61 * time.Second
	lose := &loseReplies{match: "61000"} // the claim's (and the completion's) ARGV
	c := hookedClient(t, srv, lose)
	const lease = 20 * time.Second
	b := barrier(t, c, idempotency.WithRetention(retention), idempotency.WithLease(lease))
	warm(t, c)
	admin := srv.Client()
	ctx := t.Context()

	req := idempotency.Request{Key: "pay:left"}
	lock := requestLock("idem:", req.Key)
	var runs atomic.Int32
	out, err := b.Do(ctx, req, result(&runs, "paid"))
	require.NoError(t, err)
	require.False(t, out.Replayed)
	left, err := admin.PTTL(ctx, lock).Result()
	require.NoError(t, err)
	assert.True(t, left > 0 && left <= lease, "the completed request's lock is left to expire within the lease: PTTL %v", left)

	for range 3 {
		dup, err := b.Do(ctx, req, result(&runs, "again"))
		require.NoError(t, err, "a duplicate replays: the lock left behind is not in its way")
		assert.True(t, dup.Replayed)
		assert.Equal(t, "paid", string(dup.Result))
	}
	assert.EqualValues(t, 1, runs.Load())

	require.NoError(t, admin.Del(ctx, "idem:r:"+req.Key).Err())
	_, err = b.Do(ctx, req, result(&runs, "rerun"))
	require.ErrorIs(t, err, idempotency.ErrInProgress, "a record deleted by hand: in progress until the lock expires")
	assert.EqualValues(t, 1, runs.Load())

	req = idempotency.Request{Key: "pay:undone"}
	sub := admin.Subscribe(ctx, script.Channel(requestLock("idem:", req.Key)))
	t.Cleanup(func() { _ = sub.Close() })
	_, err = sub.Receive(ctx) // confirmed before the request
	require.NoError(t, err)
	lose.n.Store(1)
	_, err = b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
		t.Error("the handler ran without the claim's reply")
		return nil, nil
	})
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	m := redistest.Await(t, probe, sub.Channel(), 5*time.Second, 3, "the undo of the lost claim published nothing")
	assert.Equal(t, wake.UndoNotice, m.Payload, "the undo of a failed attempt publishes the undo notice")
	assert.Zero(t, admin.Exists(ctx, requestLock("idem:", req.Key)).Val(), "the undo released the lock")
}

// A record in progress under a higher fence than the lock just granted
// (only a double grant makes one: here written by hand) is not taken
// over: the combined claim takes the lock, finds the record, and answers
// "in progress" without claiming it. Do reports ErrInProgress with a
// lease to wait, the handler does not run, the record keeps its owner and
// fence, and the lock taken with the claim is released.
func TestCombinedClaimLeavesARecordOfAHigherFence(t *testing.T) {
	c := store(t)
	const lease = 2 * time.Second
	b := barrier(t, c, idempotency.WithLease(lease))
	ctx := t.Context()
	req := idempotency.Request{Key: "pay:higher-fence", Fingerprint: "fp"}
	rec, lock := "idem:r:"+req.Key, requestLock("idem:", req.Key)
	fenceFromZero(t, c, lock)
	require.NoError(t, c.HSet(ctx, rec, "state", "p", "owner", "other-owner", "fence", "99", "fp", "fp").Err())
	require.NoError(t, c.Expire(ctx, rec, time.Hour).Err())
	asked := time.Now()

	_, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
		t.Error("a handler ran while a run of a higher fence owns the record")
		return nil, nil
	})
	var inProgress *idempotency.InProgressError
	require.ErrorAs(t, err, &inProgress)
	assert.Equal(t, lease, inProgress.RetryAfter, "a double grant: wait a lease")
	got, err := c.HGetAll(ctx, rec).Result()
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"state": "p", "owner": "other-owner", "fence": "99", "fp": "fp"}, got, "the record is untouched")
	fence, err := c.Get(ctx, fenceOf(lock)).Int()
	require.NoError(t, err)
	assert.Equal(t, 1, fence, "the lock was granted (fence 1) with the claim")
	at, ok, err := redistest.Expiry(ctx, c, fenceOf(lock))
	now := time.Now()
	require.NoError(t, err)
	require.True(t, ok, "the fence counter has a TTL")
	want := idempotency.DefaultRetention + lease
	assert.True(t, redistest.GivenBetween(at, asked, now, want),
		"the fence counter expires retention+lease after the grant, as the default strategy's: %v after the Do began, want %v (the Do took %v)", at.Sub(asked), want, now.Sub(asked))
	assert.Zero(t, c.Exists(ctx, lock).Val(), "and released when the claim found the record taken")
}

// singleOn is the single strategy on c, closed with the test.
func singleOn(t *testing.T, c redis.UniversalClient, opts ...single.Option) *single.Strategy {
	t.Helper()
	s, err := single.New(c, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// The lock a completed request leaves to expire stands in the way of a
// Barrier that runs the steps one by one on the same store and prefix (a
// process of an older version during a rolling upgrade, or one given the
// single strategy explicitly) only where that Barrier looks at the record
// again. Forced order: B peeks while A's handler runs ("in progress"),
// B's lock request is held in a gate before it reaches the server, A
// completes (its lock left behind), then B's request goes: refused by A's
// lock, B looks at the record again and replays A's result. Its handler
// never runs, and it never answers "in progress" for a request that is
// done.
func TestLockLeftByACompletionStandsInNoSeparateBarriersWay(t *testing.T) {
	srv, gate, slow, fast := gatedStore(t)
	acquire := script.Acquire.Hash() // B's lock request (single's Acquire)
	gate.HoldRequests(acquire)
	a := barrier(t, fast)
	b := barrier(t, slow, idempotency.WithStrategy(singleOn(t, slow, single.WithFenceTTL(idempotency.DefaultRetention+idempotency.DefaultLease))))
	ctx := t.Context()
	req := idempotency.Request{Key: "pay:left-behind", Fingerprint: "fp"}

	running, finish := make(chan struct{}), make(chan struct{})
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			close(running)
			<-finish
			return []byte("paid by A"), nil
		})
		aDone <- err
	}()
	<-running

	type answer struct {
		out idempotency.Outcome
		err error
	}
	bDone := make(chan answer, 1)
	go func() {
		out, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			t.Error("B's handler ran for a request A completed")
			return nil, nil
		})
		bDone <- answer{out, err}
	}()
	// B peeked ("in progress") and asks for the lock.
	require.NoError(t, gate.WaitHeld(1, acquire, 5*time.Second), "B's lock request is held")
	gate.HoldRequests("")
	close(finish)
	require.NoError(t, <-aDone)
	require.EqualValues(t, 1, srv.Client().Exists(ctx, requestLock("idem:", req.Key)).Val(), "A's completion left its lock")
	require.NoError(t, gate.Step(acquire, 5*time.Second))

	got := <-bDone
	require.NoError(t, got.err, "B replays; it does not answer in progress")
	assert.True(t, got.out.Replayed)
	assert.Equal(t, "paid by A", string(got.out.Result))
}
