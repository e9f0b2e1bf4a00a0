package redlease_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
)

// Found by the simulator's state-valid invariant (F1; ops-quorum seeds
// 6946 and 9070): a quorum Extend returns once a quorum answered, while
// its copies to the other nodes may still be in flight (or not yet sent:
// the fanout's per-node queues). Such a late copy of a shorter extension
// can land on a node after a later, longer one (on another connection:
// nothing orders them) and, if it resets the TTL, cut the key there back
// to the shorter TTL; a node that missed the longer extension still has
// the shorter one, and then fewer than a quorum hold the key until the
// lock's Until, although every extension asked for more than the one
// before. Forced order on nodes A, B, C (the holder reaches each through
// a gate, the second client directly): the lock, taken for 1 s, is
// extended to 1234 ms; A and B apply it and answer, so the Extend
// returns, and C's copy is held in C's gate. The lock is extended to 20 s while B is
// black-holed: A and C apply it, so it succeeds, and the lock is valid
// for about 20 s. Then C's copy of the 1234 ms extension lands. Once B's
// key has expired, the second client may not be granted the key while the
// holder's lock is still Valid. A node never shortens a held key, so C
// keeps the 20 s; the holder's Release lets the second client in.
func TestLateShorterExtendDoesNotShortenTheKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	servers := redistest.StartN(t, 3, redistest.Config{})
	gates := make([]*redistest.Gate, len(servers))
	ac := make([]redis.UniversalClient, len(servers))
	for i, s := range servers {
		loadScripts(t, s.Client())
		gates[i] = redistest.NewGate(t, s.Addr)
		ac[i] = gates[i].Client()
	}
	// A node timeout of a second: nothing here waits for a round to
	// expire, and a loaded machine must not time out the replies that do
	// come.
	qa := quorumOver(t, ac, quorum.WithNodeTimeout(time.Second))
	qb := quorumOver(t, directClients(t, servers), quorum.WithNodeTimeout(time.Second))
	la := newLocker(t, qa, redlease.WithTTL(time.Second)) // loss margin 100 ms
	lb := newLocker(t, qb, redlease.WithTTL(time.Second))
	const (
		key     = "attack:late-shorter-extend"
		short   = 1234 * time.Millisecond
		long    = 20 * time.Second
		matchS  = "$4\r\n1234\r\n" // the short extension's TTL argument, and nothing else
		nodeB   = 1
		nodeC   = 2
		stepFor = 10 * time.Second
	)
	a, err := la.TryLock(ctx, key)
	require.NoError(t, err)

	gates[nodeC].HoldRequests(matchS)
	require.NoError(t, a.Extend(ctx, short), "A and B answer: a quorum")
	require.NoError(t, gates[nodeC].WaitHeld(1, matchS, stepFor), "C's copy of the short extension is on its way")

	gates[nodeB].BlackHole() // B misses the long extension
	require.NoError(t, a.Extend(ctx, long), "A and C answer: a quorum")
	pttlC, err := servers[nodeC].Client().PTTL(ctx, key).Result()
	require.NoError(t, err)
	require.Greater(t, pttlC, short, "the long extension landed on C")

	require.NoError(t, gates[nodeC].Step(matchS, stepFor), "the short extension lands on C, last")
	until := a.Until()
	pttlC, err = servers[nodeC].Client().PTTL(ctx, key).Result()
	require.NoError(t, err)
	left := time.Until(until)
	assert.GreaterOrEqual(t, pttlC, left-2*time.Millisecond,
		"node C's PTTL %v after the late short extension: below what A's Until needs (%v left)", pttlC, left.Round(time.Millisecond))

	// Wait until B's key has expired and C's has either expired too or
	// outlives A's Until (at most 10 s: both expire 1234 ms after they
	// took the short extension, or C's lives 20 s).
	settled := func(d time.Duration) bool {
		return d == -2*time.Nanosecond || d >= time.Until(a.Until())-2*time.Millisecond
	}
	deadline := time.Now().Add(10 * time.Second)
	var report []string
	for {
		report = report[:0]
		done := true
		for _, i := range []int{nodeB, nodeC} {
			d, err := servers[i].Client().PTTL(ctx, key).Result()
			require.NoError(t, err)
			done = done && settled(d)
			report = append(report, fmt.Sprintf("node %c: PTTL %v", 'A'+i, d))
		}
		if done {
			break
		}
		require.True(t, time.Now().Before(deadline), "the keys on B and C never settled: %s", strings.Join(report, ", "))
		time.Sleep(5 * time.Millisecond) // polling for the keys' expiry, not racing it
	}

	require.True(t, a.Valid(), "A's lock must still be valid for the check to mean anything")
	b, err := lb.TryLock(ctx, key)
	if err == nil {
		t.Fatalf("double grant: the second client got the key (fence %d) while A's lock is Valid for %v more (TTL %v); %s",
			b.Fence(), time.Until(a.Until()).Round(time.Millisecond), a.TTL(), strings.Join(report, ", "))
	}
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	require.True(t, a.Valid())

	// The key kept the longer life; Release is how to let others in
	// sooner.
	require.NoError(t, a.Release(ctx))
	b, err = lb.TryLock(ctx, key)
	require.NoError(t, err, "released: the second client is granted the key")
	require.NoError(t, b.Release(ctx))
}
