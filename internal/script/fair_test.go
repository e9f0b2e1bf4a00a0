package script_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The wake channel the release scripts derive from the line's key (Lua:
// 'redlease:wake:' .. string.sub(q, 16)) is Channel's.
func TestChannelIsDerivedFromTheLine(t *testing.T) {
	for _, key := range []string{"order:7", "{order:7}:lock", "a{b}c", "{", "a}b"} {
		q := script.QueueKey(key)
		assert.Equal(t, script.Channel(key), "redlease:wake:"+q[15:], key)
	}
}

// waiterState is one waiter in a scripted line.
type waiterState struct {
	id      string
	ticket  int64
	expired bool
}

// fairState is a scripted state of one node: who holds the key, and who is
// in its line.
type fairState struct {
	holder string // "" free
	line   []waiterState
}

// fairCase is a state and an attempt on it.
type fairCase struct {
	state fairState
	token string // the attempt's token
	id    string // its waiter id (the token's base for a Lock)
	join  bool
}

func (c fairCase) String() string {
	return fmt.Sprintf("holder %q line %+v; attempt %q as %q join %v", c.state.holder, c.state.line, c.token, c.id, c.join)
}

// randomCase draws a state and an attempt from a small alphabet, so that
// ties, same bases, expired heads and absent lines all come up.
func randomCase(r *rand.Rand) fairCase {
	me := "M"
	n := 1 + r.IntN(3)
	c := fairCase{token: fmt.Sprintf("%s.%d", me, n), id: me, join: r.IntN(2) == 0}
	if r.IntN(5) == 0 { // a TryLock: no '.', never joins
		c.token, c.id, c.join = "Mtry", "Mtry", false
	}
	switch r.IntN(5) {
	case 0, 1:
	case 2:
		c.state.holder = "X.1"
	case 3:
		c.state.holder = c.token // our own retried request
	case 4:
		c.state.holder = fmt.Sprintf("%s.%d", me, r.IntN(4)) // an attempt of our own call, earlier or not
	}
	for _, id := range []string{"A", "B", me, "Z"} {
		if r.IntN(2) == 0 {
			c.state.line = append(c.state.line, waiterState{id: id, ticket: 1 + int64(r.IntN(3)), expired: r.IntN(3) == 0})
		}
	}
	return c
}

// load writes c's state under key on client.
func load(ctx context.Context, t *testing.T, client redis.UniversalClient, key string, s fairState) {
	t.Helper()
	q := script.QueueKey(key)
	require.NoError(t, client.Del(ctx, key, q).Err())
	if s.holder != "" {
		require.NoError(t, client.Set(ctx, key, s.holder, time.Minute).Err())
	}
	now := time.Now().UnixMilli()
	for _, w := range s.line {
		deadline := now + 60_000
		if w.expired {
			deadline = now - 1_000
		}
		require.NoError(t, client.ZAdd(ctx, q, redis.Z{Score: float64(w.ticket), Member: w.id},
			redis.Z{Score: -float64(deadline), Member: "@" + w.id}).Err())
	}
}

// acquire runs the Acquire script for c under key; fair or not.
func acquire(ctx context.Context, client redis.UniversalClient, key string, c fairCase, fair bool) (int64, error) {
	k := any(key)
	if !fair {
		return script.Acquire.Run(ctx, client, script.Acquire.Args(k, k, k, k, c.token, int64(60_000), script.NoFence, script.RuleOff, script.NotDurable, script.NoFenceTTL))
	}
	line := script.Acquire.Args(k, k, k, script.QueueKey(key), c.token, int64(60_000), script.NoFence, script.RuleOff, script.NotDurable, script.NoFenceTTL)
	j := "0"
	if c.join {
		j = "1"
	}
	return script.Acquire.Run(ctx, client, append(line, c.id, int64(5), j, int64(60_000)))
}

// liveHead is the head the line of s should have for an attempt: the live
// waiter with the smallest (ticket, id), counting the attempt itself when
// it joins.
func liveHead(c fairCase) string {
	head, best := "", waiterState{}
	consider := func(w waiterState) {
		if w.expired {
			return
		}
		if head == "" || w.ticket < best.ticket || (w.ticket == best.ticket && w.id < best.id) {
			head, best = w.id, w
		}
	}
	joined := false
	for _, w := range c.state.line {
		if w.id == c.id && c.join {
			w = waiterState{id: c.id, ticket: 5}
			joined = true
		}
		consider(w)
	}
	if c.join && !joined {
		consider(waiterState{id: c.id, ticket: 5})
	}
	return head
}

// Fairness only ever adds refusals: over scripted states, the fair script
// grants only where the plain script grants too (on a copy of the same
// state), and refuses a grant the plain script makes only as Queued, when
// the key is free and the line's live head is somebody else.
func checkFairOnlyRefuses(t *testing.T, client redis.UniversalClient, rounds int) {
	ctx := t.Context()
	r := rand.New(rand.NewPCG(1, 2))
	kPlain, kFair := "fair-prop:plain", "fair-prop:fair"
	granted, queued := 0, 0
	for range rounds {
		c := randomCase(r)
		load(ctx, t, client, kPlain, c.state)
		load(ctx, t, client, kFair, c.state)
		plain, err := acquire(ctx, client, kPlain, c, false)
		require.NoError(t, err, c)
		fair, err := acquire(ctx, client, kFair, c, true)
		require.NoError(t, err, c)
		if !script.IsTaken(fair) {
			granted++
			require.False(t, script.IsTaken(plain), "fair granted what the plain script refuses: %v (plain %d, fair %d)", c, plain, fair)
			continue
		}
		if script.IsTaken(plain) {
			require.NotEqual(t, int64(script.Queued), fair, "a held key must be refused as held, with its TTL: %v", c)
			continue
		}
		queued++
		require.Equal(t, int64(script.Queued), fair, "the only new refusal is Queued: %v", c)
		free := c.state.holder == ""
		require.True(t, free, "Queued on a key the plain script took over or refreshed: %v", c)
		head := liveHead(c)
		require.True(t, head != "" && head != c.id, "Queued although the live head is %q: %v", head, c)
	}
	// The draw must reach both sides of the rule, or the check says nothing.
	require.Greater(t, granted, rounds/20, "too few grants drawn")
	require.Greater(t, queued, rounds/20, "too few Queued refusals drawn")
	t.Logf("%d cases: %d fair grants, %d Queued", rounds, granted, queued)
}

func TestFairOnlyAddsRefusalsMiniredis(t *testing.T) {
	m := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	checkFairOnlyRefuses(t, client, 400)
}

func TestFairOnlyAddsRefusalsRedis(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	client := srv.Client()
	checkFairOnlyRefuses(t, client, 400)
}

// The grant and release rules of the line, step by step on a real
// redis-server: join order, a TryLock that respects the line without
// joining, an expired head skipped, the takeover of an earlier attempt of
// the same call while others are ahead, an undo that keeps the waiter's
// entry, and a release that removes the holder's entry where it was
// refused and publishes the next head.
func TestLineRulesRedis(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	client := srv.Client()
	ctx := t.Context()
	key := "fair-rules"
	q := script.QueueKey(key)
	run := func(token, id string, ticket int64, join bool, life int64) int64 {
		t.Helper()
		k := any(key)
		j := "0"
		if join {
			j = "1"
		}
		line := script.Acquire.Args(k, k, k, q, token, int64(60_000), script.NoFence, script.RuleOff, script.NotDurable, script.NoFenceTTL)
		v, err := script.Acquire.Run(ctx, client, append(line, id, ticket, j, life))
		require.NoError(t, err)
		return v
	}
	members := func() []string {
		t.Helper()
		v, err := client.ZRangeByScore(ctx, q, &redis.ZRangeBy{Min: "0", Max: "+inf"}).Result()
		require.NoError(t, err)
		return v
	}

	// A free key with no line: granted without joining.
	require.False(t, script.IsTaken(run("H.1", "H", 10, true, 60_000)))
	require.Empty(t, members())
	// B (ticket 30) and A (ticket 20) join while H holds; order by ticket.
	require.True(t, script.IsTaken(run("B.1", "B", 30, true, 60_000)))
	require.True(t, script.IsTaken(run("A.1", "A", 20, true, 60_000)))
	require.Equal(t, []string{"A", "B"}, members())
	// A TryLock neither joins nor passes.
	require.True(t, script.IsTaken(run("T", "T", 5, false, 0)))
	require.Equal(t, []string{"A", "B"}, members())

	// H releases: A, the head, is named on the wake channel.
	sub := client.Subscribe(ctx, script.Channel(key))
	t.Cleanup(func() { _ = sub.Close() })
	_, err := sub.Receive(ctx)
	require.NoError(t, err)
	n, err := script.Release.Run(ctx, client, script.ReleaseArgs(key, "H.1"))
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	msg, err := sub.ReceiveMessage(ctx)
	require.NoError(t, err)
	require.Equal(t, "A", msg.Payload, "the release names the next head")

	// The key is free: B and a TryLock are refused (A is ahead), A is granted.
	require.Equal(t, int64(script.Queued), run("B.2", "B", 30, true, 60_000))
	require.Equal(t, int64(script.Queued), run("T", "T", 5, false, 0))
	require.False(t, script.IsTaken(run("A.1", "A", 20, true, 60_000)))
	require.Equal(t, []string{"B"}, members(), "the grant leaves the line")

	// A's reply was lost; its attempt 2 takes over A.1 although B waits:
	// the takeover path is not gated.
	require.False(t, script.IsTaken(run("A.2", "A", 20, true, 60_000)))
	// The undo of A.1 (landing late) deletes nothing of A.2 and keeps B.
	n, err = script.Release.Run(ctx, client, script.UndoArgs(key, "A.1"))
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, []string{"B"}, members())

	// C (ticket 25) joins while A holds; C's join reaches this node but
	// C's attempt is refused. A undo of a failed attempt of C's call
	// keeps C in line; C's release (after a grant elsewhere) removes it.
	require.True(t, script.IsTaken(run("C.1", "C", 25, true, 60_000)))
	require.Equal(t, []string{"C", "B"}, members())
	_, err = script.Release.Run(ctx, client, script.UndoArgs(key, "C.1"))
	require.NoError(t, err)
	require.Equal(t, []string{"C", "B"}, members(), "an undo keeps the waiter in line")
	_, err = script.Release.Run(ctx, client, script.ReleaseArgs(key, "C.7"))
	require.NoError(t, err)
	require.Equal(t, []string{"B"}, members(), "a release removes its base's entry on a node that refused it")

	// D joins with the earliest ticket and a lifetime of 300 ms while Y
	// holds, and never comes back (dead, or paused). Y's key goes: D is
	// the head, and B is refused until D's entry expired, then granted.
	require.NoError(t, client.Set(ctx, key, "Y.1", time.Minute).Err())
	start := time.Now()
	require.True(t, script.IsTaken(run("D.1", "D", 1, true, 300)))
	require.Equal(t, []string{"D", "B"}, members())
	require.NoError(t, client.Del(ctx, key).Err())
	first := run("B.3", "B", 30, true, 60_000)
	if time.Since(start) < 250*time.Millisecond { // else the machine was too slow to see D's turn
		require.Equal(t, int64(script.Queued), first, "B passed a live head")
	}
	// B is granted within 5 s, widened by 3 × the stall this run measured
	// meanwhile (probe.WaitFor; the wait starts a few calls after D
	// joined), and is only ever refused as queued until then.
	v := first
	probe.WaitFor(t, 5*time.Second, 3, time.Millisecond, func() bool {
		if !script.IsTaken(v) {
			return true
		}
		require.Equal(t, int64(script.Queued), v)
		v = run("B.3", "B", 30, true, 60_000)
		return !script.IsTaken(v)
	}, "B still queued behind a dead head (lifetime 300 ms): the last reply %s, the line %s", redistest.Lazy(func() string { return fmt.Sprint(v) }), redistest.Lazy(func() string { return fmt.Sprint(members()) }))
	require.GreaterOrEqual(t, time.Since(start), 290*time.Millisecond, "B passed D before D's entry expired")
	require.Empty(t, members(), "the expired head was purged and B left on its grant")

	// An idle line vanishes: its key carries the lifetime (E joins while
	// B holds).
	joined := time.Now()
	require.True(t, script.IsTaken(run("E.1", "E", 40, true, 60_000)))
	at, ok, err := redistest.Expiry(ctx, client, q)
	now := time.Now()
	require.NoError(t, err)
	require.True(t, ok, "the line has a TTL")
	require.False(t, at.Before(joined.Add(60*time.Second-redistest.Precision)), "the line lives an entry's lifetime from E's join: it expires %v after it", at.Sub(joined))
	require.False(t, at.After(now.Add(60*time.Second+redistest.Precision)), "the line expires %v after E's join, which took %v", at.Sub(joined), now.Sub(joined))
}
