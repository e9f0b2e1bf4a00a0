package script_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/internal/wake"
)

// The Release script publishes on exactly the channel waiters subscribe to
// (Channel), for every shape of key, although the script derives the name
// from the line's key (QueueKey): on a real redis-server, a subscriber to
// Channel(key) hears the release.
func TestReleasePublishesOnTheKeysChannel(t *testing.T) {
	probe := redistest.StartStallProbe(t)
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
		m := redistest.Await(t, probe, sub.Channel(), 5*time.Second, 3, "key %q: no message on %q", key, script.Channel(key))
		require.Equal(t, script.Channel(key), m.Channel, "key %q", key)
		require.NoError(t, sub.Close())
	}
}

// An undo (a failed attempt deleting its own key) publishes the undo
// notice, which waiters answer after a growing pause (wake.UndoNotice);
// a holder's release publishes something else, answered at once.
func TestUndoPublishesTheUndoNotice(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	c := srv.Client()
	ctx := t.Context()
	const key = "order:8"
	probe := redistest.StartStallProbe(t)
	sub := c.Subscribe(ctx, script.Channel(key))
	_, err := sub.Receive(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	next := func() string {
		return redistest.Await(t, probe, sub.Channel(), 5*time.Second, 3, "nothing published").Payload
	}

	require.NoError(t, c.Set(ctx, key, "attempt.1", time.Minute).Err())
	n, err := script.Release.Run(ctx, c, script.UndoArgs(key, "attempt.1"))
	require.NoError(t, err)
	require.Equal(t, int64(1), n, "the undo deletes its attempt's key")
	require.Equal(t, wake.UndoNotice, next(), "the undo's message")

	require.NoError(t, c.Set(ctx, key, "holder.1", time.Minute).Err())
	n, err = script.Release.Run(ctx, c, script.ReleaseArgs(key, "holder.1"))
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	require.Equal(t, wake.ReleaseMark+"holder.1", next(), "a release's message, the line empty: the released token")
}
