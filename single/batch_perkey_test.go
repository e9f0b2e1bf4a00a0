package single_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/single"
)

// replaceWithHash puts a hash where a lock's string was: a key of the
// wrong type (WRONGTYPE for GET), without a TTL.
func replaceWithHash(t *testing.T, c redis.UniversalClient, key string) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, c.Del(ctx, key).Err())
	require.NoError(t, c.HSet(ctx, key, "not", "a lock").Err())
}

// One key of fifty replaced by a hash costs that lock only: the other 49
// are extended (their keys' TTLs move), and the replaced one is reported
// not held (a hash cannot hold our token), with the node's WRONGTYPE as
// its cause.
func TestExtendAllWrongTypeKeyCostsOnlyItsLock(t *testing.T) {
	ctx := t.Context()
	srv := redistest.Start(t, redistest.Config{})
	c := srv.Client()
	strategy, err := single.New(c)
	require.NoError(t, err)
	locker, err := redlease.New(strategy, redlease.WithPrefix("wrongtype:"), redlease.WithTTL(10*time.Second))
	require.NoError(t, err)
	locks := make([]*redlease.Lock, 50)
	for i := range locks {
		lk, err := locker.TryLock(ctx, fmt.Sprint(i))
		require.NoError(t, err)
		locks[i] = lk
	}
	const bad = 17
	replaceWithHash(t, c, "wrongtype:17")
	for i := range locks { // so that an extension shows in the TTL
		if i != bad {
			require.NoError(t, c.PExpire(ctx, fmt.Sprintf("wrongtype:%d", i), 3*time.Second).Err())
		}
	}
	// Every key now expires before shortened: 3 s after a PEXPIRE sent
	// before this instant.
	shortened := time.Now().Add(3 * time.Second)

	errs := redlease.ExtendAll(ctx, locks)
	require.Len(t, errs, len(locks))
	for i, err := range errs {
		if i == bad {
			continue
		}
		assert.NoError(t, err, "lock %d: its key holds its token", i)
		assert.True(t, locks[i].Valid(), "lock %d", i)
		at, ok, terr := redistest.Expiry(ctx, c, fmt.Sprintf("wrongtype:%d", i))
		require.NoError(t, terr)
		require.True(t, ok, "lock %d: its key has a TTL", i)
		assert.True(t, at.After(shortened), "lock %d: the batch moved its key's expiry (%v after the PEXPIRE's 3 s)", i, at.Sub(shortened))
		assert.False(t, at.Add(redistest.Precision).Before(locks[i].Until()), "lock %d: its key outlives its Until (by %v)", i, at.Sub(locks[i].Until()))
	}
	err = errs[bad]
	require.ErrorIs(t, err, redlease.ErrNotHeld, "a key of another type is not held under our token")
	assert.NotErrorIs(t, err, redlease.ErrUnavailable)
	var ne *redlease.NodeError
	require.ErrorAs(t, err, &ne, "the node's verdict is kept as the cause")
	assert.True(t, redis.HasErrorPrefix(ne.Err, "WRONGTYPE"), "cause: %v", ne.Err)
	assert.Equal(t, srv.Addr, ne.Addr)
	assert.False(t, locks[bad].Valid())
	assert.ErrorIs(t, locks[bad].Err(), redlease.ErrLost)
	typ, terr := c.Type(ctx, "wrongtype:17").Result()
	require.NoError(t, terr)
	assert.Equal(t, "hash", typ, "the other value is left alone")
}

// With more than one script call in the pipeline (over 500 keys), a
// command that fails fails its own keys only. Here the second call names
// a key outside the user's ACL key patterns, so the server refuses that
// whole call (NOPERM); the first call's 500 keys are extended.
func TestExtendBatchCommandErrorStaysWithItsKeys(t *testing.T) {
	ctx := t.Context()
	srv := redistest.Start(t, redistest.Config{})
	admin := srv.Client()
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", "batch", "on", ">pw", "resetkeys", "~ok:*",
		"-@all", "+hello", "+ping", "+evalsha", "+eval", "+script|load", "+get", "+pttl", "+pexpire").Err())
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "batch", Password: "pw", ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })

	const n, forbidden = 600, 550
	items := make([]redlease.Extension, n)
	for i := range items {
		key := fmt.Sprintf("ok:%d", i)
		if i == forbidden {
			key = fmt.Sprintf("elsewhere:%d", i)
		}
		tok := fmt.Sprintf("tok-%d", i)
		require.NoError(t, admin.Set(ctx, key, tok, 5*time.Second).Err())
		items[i] = redlease.Extension{Key: key, Token: tok, TTL: 20 * time.Second}
	}

	strategy, err := single.New(c)
	require.NoError(t, err)
	start := time.Now()
	out := strategy.ExtendBatch(ctx, items)
	require.Len(t, out, n)
	for i := range 500 {
		require.NoError(t, out[i].Err, "item %d: its call went through", i)
		// Until is the call's start plus 20 s less the drift allowance.
		assert.True(t, out[i].Grant.Until.After(start.Add(10*time.Second)), "item %d: Until %v after the call's start", i, out[i].Grant.Until.Sub(start))
	}
	for i := 500; i < n; i++ {
		err := out[i].Err
		require.ErrorIs(t, err, redlease.ErrDenied, "item %d: its call was refused (NOPERM), so nothing is known", i)
		assert.NotErrorIs(t, err, redlease.ErrUnavailable, "item %d: a configuration error, not an outage", i)
		assert.NotErrorIs(t, err, redlease.ErrNotHeld, "item %d", i)
		var ne *redlease.NodeError
		require.ErrorAs(t, err, &ne, "item %d", i)
		assert.True(t, redis.HasErrorPrefix(ne.Err, "NOPERM"), "item %d: %v", i, ne.Err)
	}
	at, ok, err := redistest.Expiry(ctx, admin, "ok:0")
	require.NoError(t, err)
	require.True(t, ok)
	assert.False(t, at.Add(redistest.Precision).Before(out[0].Grant.Until), "the extended key outlives its Until (by %v)", at.Sub(out[0].Grant.Until))
}

// lostNow reports whether lk's Lost channel is closed now.
func lostNow(lk *redlease.Lock) bool {
	select {
	case <-lk.Lost():
		return true
	default:
		return false
	}
}

// withDeadlineOf returns a ctx that ends when the first of locks' validity
// does, as the renew watchdog gives each batch.
func withDeadlineOf(t *testing.T, locks []*redlease.Lock) (context.Context, context.CancelFunc) {
	t.Helper()
	d := locks[0].Until()
	for _, lk := range locks[1:] {
		if u := lk.Until(); u.Before(d) {
			d = u
		}
	}
	return context.WithDeadline(t.Context(), d)
}
