package redlease_test

import (
	"context"
	"fmt"
	"strings"
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
)

// Errors read as one line with the "redlease:" prefix once: an Extend of a
// lock that ran out, a Lock whose ctx ended.
func TestErrorsAreOneLineWithOnePrefix(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFake()
		l, err := redlease.New(f, redlease.WithTTL(time.Second), redlease.WithoutKeeper())
		require.NoError(t, err)
		lk, err := l.TryLock(t.Context(), "k")
		require.NoError(t, err)
		time.Sleep(time.Until(lk.Until()))
		err = lk.Extend(t.Context(), time.Second)
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
