package idempotency_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
)

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

// The same for one-time tokens: Issue and Consume return at their ctx.
func TestTokensAreBoundedByTheirContextWithADefaultClient(t *testing.T) {
	t.Parallel()
	probe := redistest.StartStallProbe(t)
	tokens, err := idempotency.NewTokens(pausedStore(t), "")
	require.NoError(t, err)
	for name, call := range map[string]func(context.Context) error{
		"issue": func(ctx context.Context) error {
			_, err := tokens.Issue(ctx, "form", time.Minute)
			return err
		},
		"consume": func(ctx context.Context) error {
			// A well-formed token (16 zero bytes, an hour to live): only the
			// store can say whether it was issued.
			return tokens.Consume(ctx, "form", "AAAAAAAAAAAAAAAAAAAAAA."+strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 36))
		},
	} {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		start := time.Now()
		err := call(ctx)
		took := time.Since(start)
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded, name)
		assertWithin(t, probe, time.Second, start, took, "%s with a 300ms ctx and the store paused: %v", name, err)
	}
}
