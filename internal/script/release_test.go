package script_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
)

// The Release script publishes on exactly the channel waiters subscribe to
// (Channel), for every shape of key, although the script derives the name
// from the line's key (QueueKey): on a real redis-server, a subscriber to
// Channel(key) hears the release.
func TestReleasePublishesOnTheKeysChannel(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	c := srv.Client()
	ctx := t.Context()
	for _, key := range []string{"order:7", "{order:7}:lock", "a{b}c", "{a}", "a", "{"} {
		sub := c.Subscribe(ctx, script.Channel(key))
		_, err := sub.Receive(ctx) // confirmed before the release
		require.NoError(t, err)
		require.NoError(t, c.Set(ctx, key, "tok", time.Minute).Err())

		n, err := script.Release.Run(ctx, c, script.ReleaseArgs(key, "tok"))
		require.NoError(t, err)
		require.Equal(t, int64(1), n, "key %q released", key)
		select {
		case m := <-sub.Channel():
			require.Equal(t, script.Channel(key), m.Channel, "key %q", key)
		case <-time.After(5 * time.Second):
			t.Fatalf("key %q: no message on %q", key, script.Channel(key))
		}
		require.NoError(t, sub.Close())
	}
}
