// Package contract is the one test suite every redlease.Strategy runs, so the
// strategies cannot drift apart on what Acquire, Extend and Release mean.
package contract

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
)

// Setup is one strategy under test and direct access to its nodes.
type Setup struct {
	Strategy redlease.Strategy
	// Nodes are clients of every node the strategy writes to, used to look at
	// and tamper with keys behind the strategy's back.
	Nodes []redis.UniversalClient
	// Quorum is how many nodes must hold a key for it to count as held.
	Quorum int
	// Fencing says whether grants carry fences.
	Fencing bool
}

var seq atomic.Int64

// Key returns a key unique to this test run.
func Key(t *testing.T) string {
	return fmt.Sprintf("contract:%s:%d:%d", t.Name(), time.Now().UnixNano(), seq.Add(1))
}

// Run runs the suite; setup is called once per subtest.
func Run(t *testing.T, setup func(t *testing.T) Setup) {
	t.Run("AcquireExtendRelease", func(t *testing.T) {
		s := setup(t)
		ctx, key := t.Context(), Key(t)
		// A strategy's first call may do one-time work before it starts
		// its clock (quorum learns which entries are one server): that
		// time is not validity, and a check from before it would count it
		// as such (it failed once under load). Warm it up on another key.
		warm := Key(t)
		if _, err := s.Strategy.Acquire(ctx, warm, "tok-warm", time.Second); err == nil {
			_ = s.Strategy.Release(ctx, warm, "tok-warm")
		}
		before := time.Now()
		g, err := s.Strategy.Acquire(ctx, key, "tok-a", 5*time.Second)
		require.NoError(t, err)
		assert.True(t, g.Until.After(time.Now()), "Until %v must lie in the future", g.Until)
		assert.False(t, g.Until.After(before.Add(5*time.Second)), "Until %v must not exceed start+ttl", g.Until)
		assert.GreaterOrEqual(t, holders(t, s, key, "tok-a"), s.Quorum)

		g2, err := s.Strategy.Extend(ctx, key, "tok-a", 10*time.Second)
		require.NoError(t, err)
		assert.True(t, g2.Until.After(g.Until), "extended Until %v must pass the first %v", g2.Until, g.Until)
		assert.Zero(t, g2.Fence, "Extend keeps the acquisition's fence; its Grant carries none")
		// A quorum decides the call. (Not every node need hold the key, let
		// alone with the new TTL: a quorum strategy does not send a request
		// still queued for a slow node once its round is decided, and an
		// acquisition's write that lands after the extension passed that
		// node keeps its first TTL.)
		assert.GreaterOrEqual(t, extendedOn(t, s, key, "tok-a", 5*time.Second), s.Quorum, "extend must reset the TTL on a quorum")

		require.NoError(t, s.Strategy.Release(ctx, key, "tok-a"))
		// A release may return at a quorum and finish on the rest in the
		// background, within its node timeout.
		assert.Eventually(t, func() bool { return holders(t, s, key, "tok-a") == 0 }, 2*time.Second, time.Millisecond,
			"release must leave no key")
		assert.ErrorIs(t, s.Strategy.Release(ctx, key, "tok-a"), redlease.ErrNotHeld)
	})

	t.Run("ExcludesOtherTokens", func(t *testing.T) {
		s := setup(t)
		ctx, key := t.Context(), Key(t)
		_, err := s.Strategy.Acquire(ctx, key, "tok-a", 5*time.Second)
		require.NoError(t, err)
		_, err = s.Strategy.Acquire(ctx, key, "tok-b", 5*time.Second)
		assert.ErrorIs(t, err, redlease.ErrNotObtained)
		assert.ErrorIs(t, s.Strategy.Release(ctx, key, "tok-b"), redlease.ErrNotHeld)
		_, err = s.Strategy.Extend(ctx, key, "tok-b", 5*time.Second)
		assert.ErrorIs(t, err, redlease.ErrNotHeld)
		assert.GreaterOrEqual(t, holders(t, s, key, "tok-a"), s.Quorum, "a stranger's release or extend must not touch the holder's key")
		// The failed attempt by tok-b must not have left tok-b anywhere.
		assert.Zero(t, holders(t, s, key, "tok-b"))
	})

	t.Run("OwnTokenCountsAsGrant", func(t *testing.T) {
		s := setup(t)
		ctx, key := t.Context(), Key(t)
		g1, err := s.Strategy.Acquire(ctx, key, "tok-a", 5*time.Second)
		require.NoError(t, err)
		// A retried request whose first reply was lost finds its own token.
		g2, err := s.Strategy.Acquire(ctx, key, "tok-a", 5*time.Second)
		require.NoError(t, err, "an acquire that finds its own token must count as a grant")
		if s.Fencing {
			assert.GreaterOrEqual(t, g2.Fence, g1.Fence)
		}
	})

	t.Run("ExtendAfterLoss", func(t *testing.T) {
		s := setup(t)
		ctx, key := t.Context(), Key(t)
		_, err := s.Strategy.Acquire(ctx, key, "tok-a", 5*time.Second)
		require.NoError(t, err)
		// The lock is lost: someone else's token on every node. Overwriting
		// (not deleting) keeps a late write of the acquisition, still on its
		// way to a slow node, from bringing the key back: SET NX finds it.
		for _, n := range s.Nodes {
			require.NoError(t, n.Set(ctx, key, "tok-other", 5*time.Second).Err())
		}
		_, err = s.Strategy.Extend(ctx, key, "tok-a", 5*time.Second)
		assert.ErrorIs(t, err, redlease.ErrNotHeld)
		assert.Zero(t, holders(t, s, key, "tok-a"), "a failed extend must not take the key back")
	})

	t.Run("ExpiresAtTTL", func(t *testing.T) {
		s := setup(t)
		ctx, key := t.Context(), Key(t)
		g, err := s.Strategy.Acquire(ctx, key, "tok-a", 100*time.Millisecond)
		require.NoError(t, err)
		time.Sleep(time.Until(g.Until) + 50*time.Millisecond)
		_, err = s.Strategy.Acquire(ctx, key, "tok-b", time.Second)
		assert.NoError(t, err, "the key must be free once the first holder's TTL passed")
	})

	t.Run("FencesRise", func(t *testing.T) {
		s := setup(t)
		ctx, key := t.Context(), Key(t)
		var last uint64
		for i := range 5 {
			tok := fmt.Sprintf("tok-%d", i)
			g, err := s.Strategy.Acquire(ctx, key, tok, 5*time.Second)
			require.NoError(t, err)
			if s.Fencing {
				assert.Greater(t, g.Fence, last, "holder %d", i)
			} else {
				assert.Zero(t, g.Fence)
			}
			last = g.Fence
			require.NoError(t, s.Strategy.Release(ctx, key, tok))
		}
	})

	t.Run("RejectsBadInput", func(t *testing.T) {
		s := setup(t)
		ctx := t.Context()
		cases := []struct {
			name, key, token string
			ttl              time.Duration
		}{
			{"empty key", "", "tok", time.Second},
			{"empty token", "k", "", time.Second},
			{"zero ttl", "k", "tok", 0},
			{"negative ttl", "k", "tok", -time.Second},
			{"sub-millisecond ttl", "k", "tok", 500 * time.Microsecond},
			{"ttl eaten by drift", "k", "tok", 2 * time.Millisecond},
			{"brace without hash tag", "a}b", "tok", time.Second},
		}
		for _, c := range cases {
			_, err := s.Strategy.Acquire(ctx, c.key, c.token, c.ttl)
			assert.ErrorIs(t, err, redlease.ErrInvalid, "Acquire: %s", c.name)
			_, err = s.Strategy.Extend(ctx, c.key, c.token, c.ttl)
			assert.ErrorIs(t, err, redlease.ErrInvalid, "Extend: %s", c.name)
		}
		assert.ErrorIs(t, s.Strategy.Release(ctx, "", "tok"), redlease.ErrInvalid)
	})

	t.Run("CanceledContext", func(t *testing.T) {
		s := setup(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		key := Key(t)
		_, err := s.Strategy.Acquire(ctx, key, "tok-a", 5*time.Second)
		require.Error(t, err)
		assert.True(t, errors.Is(err, context.Canceled), "ctx cancellation must stay visible: %v", err)
		assert.Zero(t, holders(t, s, key, "tok-a"), "a cancelled acquire leaves no key")
	})

	t.Run("ExtendBatch", func(t *testing.T) {
		s := setup(t)
		b, ok := s.Strategy.(redlease.BatchExtender)
		if !ok {
			t.Skipf("%T extends one key at a time (no BatchExtender)", s.Strategy)
		}
		ctx := t.Context()
		var items []redlease.Extension
		for i := range 3 {
			key := fmt.Sprintf("{batch}:%s:%d", Key(t), i)
			if i != 1 { // item 1 is never acquired: its extension must fail
				_, err := s.Strategy.Acquire(ctx, key, "tok", 5*time.Second)
				require.NoError(t, err)
			}
			items = append(items, redlease.Extension{Key: key, Token: "tok", TTL: 20 * time.Second})
		}
		// A quorum strategy returns at a majority; an acquisition's request
		// still queued for a slow node is then not sent at all, so not every
		// node need ever hold the key. Wait for a quorum to.
		for _, i := range []int{0, 2} {
			require.Eventually(t, func() bool { return holders(t, s, items[i].Key, "tok") >= s.Quorum }, 2*time.Second, time.Millisecond)
		}
		items = append(items, redlease.Extension{Key: "", Token: "tok", TTL: time.Second})
		out := b.ExtendBatch(ctx, items)
		require.Len(t, out, 4)
		assert.NoError(t, out[0].Err)
		assert.ErrorIs(t, out[1].Err, redlease.ErrNotHeld)
		assert.NoError(t, out[2].Err)
		assert.ErrorIs(t, out[3].Err, redlease.ErrInvalid)
		assert.True(t, out[0].Grant.Until.After(time.Now().Add(10*time.Second)), "Until follows the new ttl")
		// A quorum decides the call; the other nodes that hold the key catch
		// up in the background.
		assert.GreaterOrEqual(t, extendedOn(t, s, items[2].Key, "tok", 10*time.Second), s.Quorum, "the batch resets the TTL on a quorum")
		assert.Zero(t, holders(t, s, items[1].Key, "tok"), "a failed extension does not create the key")
	})

	t.Run("ExtendNeverShortensTheKey", func(t *testing.T) {
		s := setup(t)
		ctx := t.Context()
		keys := []string{"{short}:" + Key(t), "{short}:" + Key(t)}
		for _, key := range keys {
			_, err := s.Strategy.Acquire(ctx, key, "tok-a", 20*time.Second)
			require.NoError(t, err)
			require.Eventually(t, func() bool { return holders(t, s, key, "tok-a") >= s.Quorum }, 2*time.Second, time.Millisecond)
		}
		// An extension to a shorter TTL is granted for that TTL, and the
		// key keeps the longer life it has: a late copy of an earlier,
		// shorter extension must never cut the key back below a later,
		// longer one's Until.
		before := time.Now()
		g, err := s.Strategy.Extend(ctx, keys[0], "tok-a", 5*time.Second)
		require.NoError(t, err, "a shorter extension of a held key is a success")
		assert.False(t, g.Until.After(before.Add(5*time.Second)), "Until %v must not exceed start+ttl", g.Until)
		checked := []string{keys[0]}
		if b, ok := s.Strategy.(redlease.BatchExtender); ok {
			out := b.ExtendBatch(ctx, []redlease.Extension{{Key: keys[1], Token: "tok-a", TTL: 5 * time.Second}})
			require.Len(t, out, 1)
			require.NoError(t, out[0].Err, "a shorter batch extension of a held key is a success")
			checked = append(checked, keys[1])
		}
		for _, key := range checked {
			assert.Equal(t, holders(t, s, key, "tok-a"), extendedOn(t, s, key, "tok-a", 15*time.Second),
				"%s: every node that holds the key keeps its 20 s", key)
			assert.GreaterOrEqual(t, extendedOn(t, s, key, "tok-a", 15*time.Second), s.Quorum, key)
		}
	})

	t.Run("ClusterSlotCompanions", func(t *testing.T) {
		s := setup(t)
		ctx := t.Context()
		// Keys with a hash tag keep it; keys without get one.
		for _, key := range []string{"{order:7}:lock:" + Key(t), Key(t)} {
			g, err := s.Strategy.Acquire(ctx, key, "tok", 5*time.Second)
			require.NoError(t, err, key)
			if s.Fencing {
				assert.NotZero(t, g.Fence)
			}
			require.NoError(t, s.Strategy.Release(ctx, key, "tok"))
		}
	})
}

// extendedOn counts the nodes where key holds token with more than ttl
// left on it.
func extendedOn(t *testing.T, s Setup, key, token string, ttl time.Duration) int {
	t.Helper()
	k := 0
	for _, n := range s.Nodes {
		if v, _ := n.Get(context.Background(), key).Result(); v == token && n.PTTL(context.Background(), key).Val() > ttl {
			k++
		}
	}
	return k
}

// holders counts the nodes where key holds token.
func holders(t *testing.T, s Setup, key, token string) int {
	t.Helper()
	n := 0
	for _, c := range s.Nodes {
		v, err := c.Get(context.Background(), key).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			t.Errorf("reading %s: %v", key, err) // Errorf, not Fatal: this runs inside Eventually's goroutine too
			continue
		}
		if v == token {
			n++
		}
	}
	return n
}
