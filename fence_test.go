package redlease_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
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

// fencedStore is the storage a fenced holder writes to: it accepts a
// write whose fence is at least the highest it accepted (a holder writes
// several times under one fence) and refuses any lower one.
type fencedStore struct {
	mu      sync.Mutex
	highest uint64
	writes  []string // who wrote, in order
}

func (s *fencedStore) write(who string, fence uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fence < s.highest {
		return false
	}
	s.highest = fence
	s.writes = append(s.writes, who)
	return true
}

// A holder paused past its lock's expiry and past its fence counter's
// expiry, while a new holder takes the lock from a counter created anew,
// still has its late write refused by a fence-checking store: the new
// counter's first fence is above every fence the expired one handed out.
// The order is forced: the paused holder writes only after the counter is
// gone from every node (polled, bounded) and the new holder has written.
func TestPausedHolderPastItsFenceCounterIsRefused(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	probe := redistest.StartStallProbe(t)
	const ttl, keep = time.Second, time.Second
	for _, c := range fenceTTLCases(t, keep) {
		t.Run(c.name, func(t *testing.T) {
			l, err := redlease.New(c.s, redlease.WithTTL(ttl))
			require.NoError(t, err)
			const key = "payment:77"
			// Earlier holders, so that the expired counter handed out
			// more than one fence.
			// Acquisitions here are Lock calls (retried, 10 s at most): the
			// quorum's default node timeout (100 ms) is missed by a loaded
			// machine, and a missed round says nothing about fences.
			for range 3 {
				lk, err := lockWithin(ctx, l, key)
				require.NoError(t, err)
				require.NoError(t, lk.Release(ctx))
			}
			old, err := lockWithin(ctx, l, key)
			require.NoError(t, err)
			require.NotZero(t, old.Fence())
			// The holder pauses. Wait until its lock and the fence counter
			// are gone from every node: within 10 s, widened by 3 × the
			// stall this run measured meanwhile (probe.WaitFor).
			fk := script.MustFenceKey(key)
			checked := 0
			var left []string // the nodes that still had either key at the last look
			probe.WaitFor(t, 10*time.Second, 3, 5*time.Millisecond, func() bool {
				left = left[:0]
				for i, n := range c.nodes {
					nk, err := n.Client().Exists(ctx, key, fk).Result()
					require.NoError(t, err)
					checked++
					if nk != 0 {
						left = append(left, fmt.Sprintf("node %d: %d of the 2 keys", i, nk))
					}
				}
				return len(left) == 0
			}, "the lock and the fence counter (TTLs %v and %v) still exist: %s", ttl, keep, redistest.Lazy(func() string { return strings.Join(left, ", ") }))
			require.Positive(t, checked)

			store := &fencedStore{}
			next, err := lockWithin(ctx, l, key)
			require.NoError(t, err, "the lock is free (a Lock call of 10 s at most)")
			require.True(t, store.write("new", next.Fence()), "the new holder's write")
			// The paused holder wakes and writes with its old fence.
			require.False(t, store.write("paused", old.Fence()), "the paused holder's late write must be refused (fences %d then %d)", old.Fence(), next.Fence())
			require.Greater(t, next.Fence(), old.Fence(), "a counter created anew starts above every fence the expired one handed out")
			require.Equal(t, []string{"new"}, store.writes)
			require.NoError(t, next.Release(ctx))
		})
	}
}

// lockWithin takes key with a Lock call of 10 s at most.
func lockWithin(ctx context.Context, l *redlease.Locker, key string) (*redlease.Lock, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return l.Lock(ctx, key)
}
