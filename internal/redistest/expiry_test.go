package redistest_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
)

// Expiry places a key's expiry between the instants around the write that
// set its TTL plus that TTL, however long the write and the read took; a
// key without a TTL, or absent, has none.
func TestExpiryIsTheKeysExpiryByTheServersClock(t *testing.T) {
	ctx := t.Context()
	c := redistest.Start(t, redistest.Config{}).Client()
	const ttl = 5 * time.Second
	before := time.Now()
	require.NoError(t, c.Set(ctx, "k", "v", ttl).Err())
	after := time.Now()
	at, ok, err := redistest.Expiry(ctx, c, "k")
	require.NoError(t, err)
	require.True(t, ok)
	// The server set the expiry from a millisecond it read between before
	// and after; at is that expiry, to within Precision.
	assert.False(t, at.Before(before.Truncate(time.Millisecond).Add(ttl-redistest.Precision)), "at %v, the write began at %v", at, before)
	assert.False(t, at.After(after.Add(ttl+redistest.Precision)), "at %v, the write ended at %v", at, after)

	require.NoError(t, c.Set(ctx, "forever", "v", 0).Err())
	_, ok, err = redistest.Expiry(ctx, c, "forever")
	require.NoError(t, err)
	assert.False(t, ok, "no TTL")
	_, ok, err = redistest.Expiry(ctx, c, "absent")
	require.NoError(t, err)
	assert.False(t, ok, "absent")
}
