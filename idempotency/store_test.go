package idempotency_test

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
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
)

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

// grantAll is a broken strategy that grants every Acquire, with rising
// fences: a double grant on demand.
type grantAll struct{ fence atomic.Uint64 }

var _ redlease.Strategy = (*grantAll)(nil)

func (g *grantAll) Acquire(_ context.Context, _, _ string, ttl time.Duration) (redlease.Grant, error) {
	return redlease.Grant{Until: time.Now().Add(ttl), Fence: g.fence.Add(1)}, nil
}

func (g *grantAll) Extend(_ context.Context, _, _ string, ttl time.Duration) (redlease.Grant, error) {
	return redlease.Grant{Until: time.Now().Add(ttl)}, nil
}

func (g *grantAll) Release(context.Context, string, string) error { return nil }

// Fencing says it fences: its fences rise.
func (g *grantAll) Fencing() bool { return true }

// Under a double grant both holders believe in their lock, so neither run
// is cancelled; the record's owner check still refuses the result of the
// one that was taken over (the lower fence), and the newer owner's stands.
func TestStaleOwnersCompleteIsRefusedUnderADoubleGrant(t *testing.T) {
	b := barrier(t, store(t), idempotency.WithStrategy(&grantAll{}))
	ctx := t.Context()
	req := idempotency.Request{Key: "double"}
	started, proceed := make(chan struct{}), make(chan struct{})
	stale := make(chan error, 1)
	go func() {
		_, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) {
			close(started)
			<-proceed
			return []byte("stale"), nil
		})
		stale <- err
	}()
	awaitHandler(t, started, stale)
	out, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte("fresh"), nil })
	close(proceed)
	require.NoError(t, err, "the higher fence takes the record over")
	assert.Equal(t, "fresh", string(out.Result))
	staleErr := <-stale
	assert.ErrorIs(t, staleErr, idempotency.ErrNotOwner, "the stale owner's result is refused")
	assert.NotErrorIs(t, staleErr, idempotency.ErrRunCancelled, "its lock was never lost")
	replay, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte("third"), nil })
	require.NoError(t, err)
	assert.True(t, replay.Replayed)
	assert.Equal(t, "fresh", string(replay.Result))
}

// defaultClientStore starts a redis-server and returns it with a client
// on go-redis's default options: no ContextTimeoutEnabled, so a call to a
// paused server waits for the 3 s read timeout and retries unless the
// library bounds it. Cleanup resumes the server (SIGCONT; harmless if it
// runs) and closes the client.
func defaultClientStore(t *testing.T) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t, redistest.Config{})
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() {
		srv.Resume()
		_ = c.Close()
	})
	return srv, c
}

// pausedStore is defaultClientStore's client, its server paused (SIGSTOP).
func pausedStore(t *testing.T) *redis.Client {
	t.Helper()
	srv, c := defaultClientStore(t)
	srv.Pause()
	return c
}

// With the store paused and a store client on go-redis's default options,
// Do returns at its ctx (plus a little), not at the client's read timeout
// and retries: before the handler (the claim), and after it (the record
// and the lock's release, bounded by what is left of the lease).
func TestDoIsBoundedByItsContextWithADefaultClient(t *testing.T) {
	t.Parallel()
	b := barrier(t, pausedStore(t), idempotency.WithLease(900*time.Millisecond), idempotency.WithRetention(time.Minute))

	probe := redistest.StartStallProbe(t)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := b.Do(ctx, idempotency.Request{Key: "pay:2"}, func(context.Context, uint64) ([]byte, error) {
		t.Error("the handler ran with the store paused")
		return nil, nil
	})
	took := time.Since(start)
	assert.Error(t, err)
	assertWithin(t, probe, time.Second, start, took, "Do with a 300ms ctx and the store paused returned after %v: %v", took, err)
}
