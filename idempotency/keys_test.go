package idempotency_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
)

// result is a handler that counts its runs and returns s.
func result(runs *atomic.Int32, s string) idempotency.Handler {
	return func(context.Context, uint64) ([]byte, error) {
		runs.Add(1)
		return []byte(s), nil
	}
}

// No request key can name a record on the Redis key of another request's
// lock. Under the old layout (records at prefix+key, locks at
// prefix+"lock:"+hex(sha256(key)[:16])) the key "lock:"+hex(sha256(other)[:16])
// did, and each request then failed on the other's key (WRONGTYPE), or
// could not take its lock at all.
func TestRequestKeyCannotCollideWithAnotherRequestsLock(t *testing.T) {
	const other = "order:1"
	sum := sha256.Sum256([]byte(other))
	colliding := "lock:" + hex.EncodeToString(sum[:16])

	t.Run("while the other request holds its lock", func(t *testing.T) {
		b := barrier(t, store(t))
		ctx := t.Context()
		running, finish := make(chan struct{}), make(chan struct{})
		release := sync.OnceFunc(func() { close(finish) })
		defer release()
		otherDone := make(chan error, 1)
		go func() {
			_, err := b.Do(ctx, idempotency.Request{Key: other}, func(context.Context, uint64) ([]byte, error) {
				close(running)
				<-finish
				return []byte("other"), nil
			})
			otherDone <- err
		}()
		<-running

		var runs atomic.Int32
		out, err := b.Do(ctx, idempotency.Request{Key: colliding}, result(&runs, "colliding"))
		require.NoError(t, err, "a request whose key looks like another request's lock runs normally")
		assert.Equal(t, "colliding", string(out.Result))
		assert.False(t, out.Replayed)

		release()
		require.NoError(t, <-otherDone, "the other request completes normally")
		for key, want := range map[string]string{other: "other", colliding: "colliding"} {
			out, err := b.Do(ctx, idempotency.Request{Key: key}, result(&runs, "ran again"))
			require.NoError(t, err, key)
			assert.True(t, out.Replayed, key)
			assert.Equal(t, want, string(out.Result), key)
		}
		assert.EqualValues(t, 1, runs.Load())
	})

	t.Run("before the other request takes its lock", func(t *testing.T) {
		b := barrier(t, store(t))
		ctx := t.Context()
		var runs atomic.Int32
		_, err := b.Do(ctx, idempotency.Request{Key: colliding}, result(&runs, "colliding"))
		require.NoError(t, err)
		out, err := b.Do(ctx, idempotency.Request{Key: other}, result(&runs, "other"))
		require.NoError(t, err, "the other request can still take its lock")
		assert.Equal(t, "other", string(out.Result))
		assert.False(t, out.Replayed)
		assert.EqualValues(t, 2, runs.Load())
	})
}

// The Consumer's messages and the Barrier's own request keys live apart: a
// message id and a request key never share a record, whatever their
// spelling (the Consumer used to key a message as "msg:"+id, which a
// request could spell too).
func TestConsumerMessagesAndRequestKeysNeverShareARecord(t *testing.T) {
	b := barrier(t, store(t))
	consumer := newConsumer(t, b)
	ctx := t.Context()
	var runs atomic.Int32

	ack, err := consumer.Handle(ctx, "42", result(&runs, "message"))
	require.NoError(t, err)
	require.True(t, ack)
	out, err := b.Do(ctx, idempotency.Request{Key: "msg:42"}, result(&runs, "request"))
	require.NoError(t, err)
	assert.False(t, out.Replayed, "a request is not a replay of a message")
	assert.Equal(t, "request", string(out.Result))

	_, err = b.Do(ctx, idempotency.Request{Key: "msg:7"}, result(&runs, "request"))
	require.NoError(t, err)
	ack, err = consumer.Handle(ctx, "7", result(&runs, "message"))
	require.NoError(t, err)
	assert.True(t, ack)
	assert.EqualValues(t, 4, runs.Load(), "each of the four ran once")

	ack, err = consumer.Handle(ctx, "", result(&runs, "message"))
	assert.ErrorIs(t, err, redlease.ErrInvalid, "an empty message id is refused")
	assert.False(t, ack)
}

// The middleware's records and the Barrier's own request keys live apart:
// a request key spelled like the middleware's record name (Key("http",
// principal, method, route, key)) does not replay an HTTP response.
func TestMiddlewareAndRequestKeysNeverShareARecord(t *testing.T) {
	_, b := httpStore(t)
	o := &orders{}
	mw := httpMiddleware(t, b, idempotency.WithGlobalKeys())
	h := mw(o)
	rec := serveHTTP(h, keyed(http.MethodPost, "/orders", httpKey, "x"))
	require.Equal(t, http.StatusCreated, rec.Code)

	var runs atomic.Int32
	key := idempotency.Key("http", "", http.MethodPost, "/orders", strings.Trim(httpKey, `"`))
	out, err := b.Do(t.Context(), idempotency.Request{Key: key}, result(&runs, "request"))
	require.NoError(t, err)
	assert.False(t, out.Replayed, "a request is not a replay of an HTTP response")
	assert.Equal(t, "request", string(out.Result))
	assert.EqualValues(t, 1, o.calls.Load())
}

// A Barrier prefix inside redlease.ReservedPrefix is refused: that
// namespace holds redlease's own keys (fence counters, markers).
func TestBarrierPrefixMayNotEnterTheReservedNamespace(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never used
	t.Cleanup(func() { _ = c.Close() })
	for _, prefix := range []string{redlease.ReservedPrefix, redlease.ReservedPrefix + "idem:"} {
		_, err := idempotency.New(c, idempotency.WithPrefix(prefix))
		assert.ErrorIs(t, err, redlease.ErrInvalid, "prefix %q", prefix)
		assert.ErrorContains(t, err, "reserved", "prefix %q: the error says why", prefix)
	}
	for _, prefix := range []string{"", "idem:", "redlease", "app:redlease:"} {
		_, err := idempotency.New(c, idempotency.WithPrefix(prefix))
		assert.NoError(t, err, "prefix %q", prefix)
	}
}

// Records and locks of a Barrier stay under its prefix, and apart.
func TestBarrierKeysStayUnderItsPrefix(t *testing.T) {
	c := store(t)
	b := barrier(t, c, idempotency.WithPrefix("app:"))
	ctx := t.Context()
	running, finish := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := b.Do(ctx, idempotency.Request{Key: "k"}, func(context.Context, uint64) ([]byte, error) {
			close(running)
			<-finish
			return nil, nil
		})
		done <- err
	}()
	<-running
	keys, err := c.Keys(ctx, "*").Result()
	close(finish)
	require.NoError(t, <-done)
	require.NoError(t, err)
	var records, locks int
	for _, k := range keys {
		switch {
		case k == "app:r:k":
			records++
		case strings.HasPrefix(k, "app:l:"):
			locks++
		case strings.Contains(k, "app:l:") || strings.HasPrefix(k, redlease.ReservedPrefix):
			// the lock's fence counter, however the strategy names it
		default:
			t.Errorf("key %q outside the Barrier's layout", k)
		}
	}
	assert.Equal(t, 1, records, "%q", keys)
	assert.Equal(t, 1, locks, "%q", keys)
}
