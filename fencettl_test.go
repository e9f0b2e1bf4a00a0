package redlease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// Fence counters of locks whose fences nobody compares for long (request
// locks of an idempotency barrier) expire with WithFenceTTL, instead of
// one key per request name piling up forever; and a TTL longer than the
// counter's is refused, since the counter must outlive the lock.
func TestFenceCountersExpireWithFenceTTL(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const keep = 5 * time.Second
	for _, c := range fenceTTLCases(t, keep) {
		t.Run(c.name, func(t *testing.T) {
			l, err := redlease.New(c.s, redlease.WithTTL(time.Second))
			require.NoError(t, err)
			var last uint64
			for i := range 3 {
				lk, err := l.TryLock(ctx, "request:1")
				require.NoError(t, err, "attempt %d", i)
				require.Greater(t, lk.Fence(), last, "fences still rise")
				last = lk.Fence()
				require.NoError(t, lk.Release(ctx))
			}
			fk := script.MustFenceKey("request:1")
			withTTL := 0
			for _, n := range c.nodes {
				pttl, err := n.Client().PTTL(ctx, fk).Result()
				require.NoError(t, err)
				if pttl > 0 {
					require.LessOrEqual(t, pttl, keep)
					withTTL++
				} else {
					require.Equal(t, time.Duration(-2), pttl, "a counter without a TTL on %s", n.Addr)
				}
			}
			require.GreaterOrEqual(t, withTTL, len(c.nodes)/2+1, "the counters expire")
			_, err = l.TryLock(ctx, "request:2", redlease.WithTTL(2*keep))
			require.ErrorIs(t, err, redlease.ErrInvalid, "a lock that would outlive its fence counter")
		})
	}
}

// fenceTTLCase is a fenced strategy whose counters expire keep after their
// last grant, with the servers its counters live on.
type fenceTTLCase struct {
	name  string
	s     redlease.Strategy
	nodes []*redistest.Server
}

// fenceTTLCases are single on one new server and quorum on three, each
// built WithFenceTTL(keep).
func fenceTTLCases(t *testing.T, keep time.Duration) []fenceTTLCase {
	srv := redistest.Start(t, redistest.Config{})
	servers := redistest.StartN(t, 3, redistest.Config{})
	s, err := single.New(srv.Client(), single.WithFenceTTL(keep))
	require.NoError(t, err)
	return []fenceTTLCase{
		{"single", s, []*redistest.Server{srv}},
		{"quorum", quorumOver(t, directClients(t, servers), quorum.WithFencing(), quorum.WithFenceTTL(keep)), servers},
	}
}
