package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
)

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
