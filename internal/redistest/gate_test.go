package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The gate applies held requests in the order the test steps them, not in
// the order the clients sent them, and keeps a reply back until released.
func TestGateOrdersHeldRequests(t *testing.T) {
	srv := Start(t, Config{})
	g := NewGate(t, srv.Addr)
	ctx := context.Background()
	a := redis.NewClient(&redis.Options{Addr: g.Addr})
	b := redis.NewClient(&redis.Options{Addr: g.Addr})
	defer func() { _ = a.Close(); _ = b.Close() }()
	require.NoError(t, a.Ping(ctx).Err())
	require.NoError(t, b.Ping(ctx).Err())

	g.HoldRequests("gated")
	first := make(chan error, 1)
	go func() { first <- a.Set(ctx, "gated", "first", 0).Err() }()
	require.NoError(t, g.WaitHeld(1, "first", 5*time.Second))
	second := make(chan error, 1)
	go func() { second <- b.Set(ctx, "gated", "second", 0).Err() }()
	require.NoError(t, g.WaitHeld(1, "second", 5*time.Second))
	require.Equal(t, int64(0), srv.Client().Exists(ctx, "gated").Val(), "held requests must not reach the server")

	// Apply the second one first, then the first.
	require.NoError(t, g.Step("second", 5*time.Second))
	require.NoError(t, <-second)
	require.Equal(t, "second", srv.Client().Get(ctx, "gated").Val())
	require.NoError(t, g.Step("", 5*time.Second))
	require.NoError(t, <-first)
	require.Equal(t, "first", srv.Client().Get(ctx, "gated").Val())

	// A held reply: the command is applied, the client does not know yet.
	g.HoldRequests("")
	g.HoldReplies("reply-me")
	done := make(chan error, 1)
	go func() { done <- a.Set(ctx, "reply-me", "1", 0).Err() }()
	require.NoError(t, g.WaitHeld(1, "", 5*time.Second))
	require.Equal(t, "1", srv.Client().Get(ctx, "reply-me").Val())
	select {
	case err := <-done:
		t.Fatalf("reply arrived while held: %v", err)
	default:
	}
	g.Open()
	require.NoError(t, <-done)
}

// DropReplies swallows a published message on its way to a subscriber
// through the gate; the subscription connection stays open, and the next
// message, once the drop is lifted, arrives.
func TestGateDropsPublishedMessages(t *testing.T) {
	srv := Start(t, Config{})
	g := NewGate(t, srv.Addr)
	ctx := t.Context()
	sub := redis.NewClient(&redis.Options{Addr: g.Addr})
	defer func() { _ = sub.Close() }()
	ps := sub.Subscribe(ctx, "ch")
	defer func() { _ = ps.Close() }()
	_, err := ps.ReceiveTimeout(ctx, 5*time.Second) // the confirmation
	require.NoError(t, err)
	pub := srv.Client()

	g.DropReplies("swallow-me")
	require.Equal(t, int64(1), pub.Publish(ctx, "ch", "swallow-me").Val(), "the server sent it to its one subscriber")
	require.Eventually(t, func() bool { return g.Dropped() == 1 }, 5*time.Second, time.Millisecond)
	g.DropReplies("")
	require.Equal(t, int64(1), pub.Publish(ctx, "ch", "keep-me").Val())
	msg, err := ps.ReceiveTimeout(ctx, 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "keep-me", msg.(*redis.Message).Payload, "the dropped message never arrives, the next one does, on the same connection")
	require.Equal(t, 1, g.Dropped())
}
