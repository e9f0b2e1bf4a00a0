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
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/contract"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/single"
)

// The single strategy and the idempotency barrier on a real three-master
// Redis Cluster: keys spread over the masters, and every script's keys
// (lock and fence counter, record) share a slot, or the cluster would
// answer CROSSSLOT.
func TestOnThreeMasterCluster(t *testing.T) {
	servers := redistest.StartCluster(t, 3)
	c := redistest.ClusterClient(t, servers)
	contract.Run(t, func(t *testing.T) contract.Setup {
		strategy, err := single.New(c)
		require.NoError(t, err)
		return contract.Setup{Strategy: strategy, Nodes: []redis.UniversalClient{c}, Quorum: 1, Fencing: true}
	})

	t.Run("keys spread over the masters", func(t *testing.T) {
		ctx := t.Context()
		s, err := single.New(c)
		require.NoError(t, err)
		masters := map[string]bool{}
		for i := range 30 {
			key := fmt.Sprintf("spread:%d", i)
			_, err := s.Acquire(ctx, key, "tok", 10e9)
			require.NoError(t, err)
			err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				if n, _ := m.Exists(ctx, key).Result(); n == 1 {
					masters[m.Options().Addr] = true
				}
				return nil
			})
			require.NoError(t, err)
		}
		assert.Len(t, masters, 3, "locks live on every master")
	})

	t.Run("idempotency barrier", func(t *testing.T) {
		ctx := t.Context()
		b, err := idempotency.New(c)
		require.NoError(t, err)
		for i := range 20 {
			req := idempotency.Request{Key: fmt.Sprintf("order:%d", i), Fingerprint: "fp"}
			first, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return []byte(fmt.Sprint(i)), nil })
			require.NoError(t, err)
			again, err := b.Do(ctx, req, func(context.Context, uint64) ([]byte, error) { return nil, fmt.Errorf("ran twice") })
			require.NoError(t, err)
			assert.True(t, again.Replayed)
			assert.Equal(t, first.Result, again.Result)
		}
		tokens, err := idempotency.NewTokens(c, "")
		require.NoError(t, err)
		tok, err := tokens.Issue(ctx, "form", 0)
		require.NoError(t, err)
		require.NoError(t, tokens.Consume(ctx, "form", tok))
	})
}

// On a Cluster client, a release on any master wakes a waiter whose one
// subscription connection went to whichever node: the release script's
// PUBLISH is carried by the cluster bus (see the package documentation for
// why not SPUBLISH). Keys on every master; backoff 10 s, so only the
// notice can hand over within seconds.
func TestClusterReleaseWakesWaiters(t *testing.T) {
	servers := redistest.StartCluster(t, 3)
	c := redistest.ClusterClient(t, servers)
	s, err := single.New(c)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ctx := t.Context()
	holder, err := redlease.New(s, redlease.WithTTL(30*time.Second))
	require.NoError(t, err)
	waiter, err := redlease.New(s, redlease.WithTTL(30*time.Second), redlease.WithRetryDelay(10*time.Second, 10*time.Second))
	require.NoError(t, err)
	for i := range 6 { // keys on different masters
		key := fmt.Sprintf("cluster:wake:%d", i)
		lk, err := holder.TryLock(ctx, key)
		require.NoError(t, err)
		got := make(chan error, 1)
		go func() {
			wl, err := waiter.Lock(ctx, key)
			if err == nil {
				err = wl.Release(ctx)
			}
			got <- err
		}()
		time.Sleep(300 * time.Millisecond) // subscribed and waiting
		require.NoError(t, lk.Release(ctx))
		select {
		case err := <-got:
			require.NoError(t, err, key)
		case <-time.After(3 * time.Second):
			t.Fatalf("%s: the waiter was not woken by the release within 3 s (its backoff is 5–10 s)", key)
		}
	}
}
