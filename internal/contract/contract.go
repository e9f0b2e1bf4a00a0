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
	runLockSet(t, setup)
	runInspect(t, setup)
	runSemaphore(t, setup)
	runElection(t, setup)
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
		must(t, err, "Acquire")
		check(t, g.Until.After(time.Now()), "Until %v must lie in the future", g.Until)
		check(t, !g.Until.After(before.Add(5*time.Second)), "Until %v must not exceed start+ttl", g.Until)
		atLeast(t, holders(t, s, key, "tok-a"), s.Quorum, "holders")

		g2, err := s.Strategy.Extend(ctx, key, "tok-a", 10*time.Second)
		must(t, err, "Extend")
		check(t, g2.Until.After(g.Until), "extended Until %v must pass the first %v", g2.Until, g.Until)
		check(t, g2.Fence == 0, "Extend keeps the acquisition's fence; its Grant carries none, got %d", g2.Fence)
		// A quorum decides the call. (Not every node need hold the key, let
		// alone with the new TTL: a quorum strategy does not send a request
		// still queued for a slow node once its round is decided, and an
		// acquisition's write that lands after the extension passed that
		// node keeps its first TTL.)
		atLeast(t, extendedOn(t, s, key, "tok-a", 5*time.Second), s.Quorum, "extend must reset the TTL on a quorum")

		must(t, s.Strategy.Release(ctx, key, "tok-a"), "Release")
		// A release may return at a quorum and finish on the rest in the
		// background, within its node timeout.
		check(t, eventually(func() bool { return holders(t, s, key, "tok-a") == 0 }, 2*time.Second),
			"release must leave no key")
		isErr(t, s.Strategy.Release(ctx, key, "tok-a"), redlease.ErrNotHeld, "second Release")
	})

	t.Run("ExcludesOtherTokens", func(t *testing.T) {
		s := setup(t)
		ctx, key := t.Context(), Key(t)
		_, err := s.Strategy.Acquire(ctx, key, "tok-a", 5*time.Second)
		must(t, err, "Acquire")
		_, err = s.Strategy.Acquire(ctx, key, "tok-b", 5*time.Second)
		isErr(t, err, redlease.ErrNotObtained, "Acquire by another token")
		isErr(t, s.Strategy.Release(ctx, key, "tok-b"), redlease.ErrNotHeld, "Release by another token")
		_, err = s.Strategy.Extend(ctx, key, "tok-b", 5*time.Second)
		isErr(t, err, redlease.ErrNotHeld, "Extend by another token")
		atLeast(t, holders(t, s, key, "tok-a"), s.Quorum, "a stranger's release or extend must not touch the holder's key")
		// The failed attempt by tok-b must not have left tok-b anywhere.
		none(t, holders(t, s, key, "tok-b"), "nodes holding tok-b")
	})

	t.Run("OwnTokenCountsAsGrant", func(t *testing.T) {
		s := setup(t)
		ctx, key := t.Context(), Key(t)
		g1, err := s.Strategy.Acquire(ctx, key, "tok-a", 5*time.Second)
		must(t, err, "Acquire")
		// A retried request whose first reply was lost finds its own token.
		g2, err := s.Strategy.Acquire(ctx, key, "tok-a", 5*time.Second)
		must(t, err, "an acquire that finds its own token must count as a grant")
		if s.Fencing {
			check(t, g2.Fence >= g1.Fence, "second fence %d must not fall below the first %d", g2.Fence, g1.Fence)
		}
	})

	t.Run("ExtendAfterLoss", func(t *testing.T) {
		s := setup(t)
		ctx, key := t.Context(), Key(t)
		_, err := s.Strategy.Acquire(ctx, key, "tok-a", 5*time.Second)
		must(t, err, "Acquire")
		// The lock is lost: someone else's token on every node. Overwriting
		// (not deleting) keeps a late write of the acquisition, still on its
		// way to a slow node, from bringing the key back: SET NX finds it.
		for _, n := range s.Nodes {
			must(t, n.Set(ctx, key, "tok-other", 5*time.Second).Err(), "SET on a node")
		}
		_, err = s.Strategy.Extend(ctx, key, "tok-a", 5*time.Second)
		isErr(t, err, redlease.ErrNotHeld, "Extend of a lost lock")
		none(t, holders(t, s, key, "tok-a"), "a failed extend must not take the key back")
	})

	t.Run("ExpiresAtTTL", func(t *testing.T) {
		s := setup(t)
		ctx := t.Context()
		// The grant is this subtest's precondition, not its claim: an
		// Acquire that takes longer than its TTL (less the drift
		// allowance) comes back with no validity left, ErrNotObtained on a
		// key nobody else holds (at load 25, on a Cluster with replicas:
		// 151 ms against 100 ms). Such a try is made again on a fresh key
		// with a TTL derived from it: at least twice the last TTL and four
		// times what the try took. Bounded at five tries.
		const maxAttempt = 5
		ttl := 100 * time.Millisecond
		var (
			key   string
			start time.Time
			g     redlease.Grant
			err   error
		)
		for attempt := 1; ; attempt++ {
			key = fmt.Sprintf("%s:%d", Key(t), attempt)
			start = time.Now()
			g, err = s.Strategy.Acquire(ctx, key, "tok-a", ttl)
			if err == nil || !errors.Is(err, redlease.ErrNotObtained) || attempt == maxAttempt {
				break
			}
			took := time.Since(start)
			t.Logf("try %d with TTL %v took %v and came back with no validity left (%v): again with a longer TTL", attempt, ttl, took, err)
			ttl = max(2*ttl, 4*took)
		}
		must(t, err, "Acquire with TTL %v", ttl)
		// Every node set the key with PX ttl before the reply, so it is gone
		// by the reply's arrival + ttl (+ 5 ms for the millisecond rounding
		// of expiry). Until is only a lower bound (taken from the start of
		// the call, less the drift allowance): on a loaded machine the
		// script can run 50 ms or more after the start.
		replied := time.Now()
		time.Sleep(time.Until(replied.Add(ttl + 5*time.Millisecond)))
		_, err = s.Strategy.Acquire(ctx, key, "tok-b", time.Second)
		check(t, err == nil, "the key must be free once the first holder's TTL passed "+
			"(the Acquire took %v, Until was %v after its start; tried %v after its reply): %v",
			replied.Sub(start), g.Until.Sub(start), time.Since(replied), err)
	})

	t.Run("FencesRise", func(t *testing.T) {
		s := setup(t)
		ctx, key := t.Context(), Key(t)
		var last uint64
		for i := range 5 {
			tok := fmt.Sprintf("tok-%d", i)
			g, err := s.Strategy.Acquire(ctx, key, tok, 5*time.Second)
			must(t, err, "Acquire by holder %d", i)
			if s.Fencing {
				check(t, g.Fence > last, "holder %d: fence %d must exceed the last %d", i, g.Fence, last)
			} else {
				check(t, g.Fence == 0, "holder %d: fence %d without fencing", i, g.Fence)
			}
			last = g.Fence
			must(t, s.Strategy.Release(ctx, key, tok), "Release by holder %d", i)
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
			isErr(t, err, redlease.ErrInvalid, "Acquire: %s", c.name)
			_, err = s.Strategy.Extend(ctx, c.key, c.token, c.ttl)
			isErr(t, err, redlease.ErrInvalid, "Extend: %s", c.name)
		}
		isErr(t, s.Strategy.Release(ctx, "", "tok"), redlease.ErrInvalid, "Release of an empty key")
	})

	t.Run("CanceledContext", func(t *testing.T) {
		s := setup(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		key := Key(t)
		_, err := s.Strategy.Acquire(ctx, key, "tok-a", 5*time.Second)
		if err == nil {
			t.Fatal("Acquire with a cancelled ctx: got nil error")
		}
		check(t, errors.Is(err, context.Canceled), "ctx cancellation must stay visible: %v", err)
		none(t, holders(t, s, key, "tok-a"), "a cancelled acquire leaves no key")
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
				must(t, err, "Acquire %s", key)
			}
			items = append(items, redlease.Extension{Key: key, Token: "tok", TTL: 20 * time.Second})
		}
		// A quorum strategy returns at a majority; an acquisition's request
		// still queued for a slow node is then not sent at all, so not every
		// node need ever hold the key. Wait for a quorum to.
		for _, i := range []int{0, 2} {
			if !eventually(func() bool { return holders(t, s, items[i].Key, "tok") >= s.Quorum }, 2*time.Second) {
				t.Fatalf("%s: no quorum holds the key within 2s", items[i].Key)
			}
		}
		items = append(items, redlease.Extension{Key: "", Token: "tok", TTL: time.Second})
		out := b.ExtendBatch(ctx, items)
		if len(out) != 4 {
			t.Fatalf("ExtendBatch: got %d results, want 4", len(out))
		}
		check(t, out[0].Err == nil, "item 0: %v", out[0].Err)
		isErr(t, out[1].Err, redlease.ErrNotHeld, "item 1")
		check(t, out[2].Err == nil, "item 2: %v", out[2].Err)
		isErr(t, out[3].Err, redlease.ErrInvalid, "item 3")
		check(t, out[0].Grant.Until.After(time.Now().Add(10*time.Second)), "Until %v follows the new ttl", out[0].Grant.Until)
		// A quorum decides the call; the other nodes that hold the key catch
		// up in the background.
		atLeast(t, extendedOn(t, s, items[2].Key, "tok", 10*time.Second), s.Quorum, "the batch resets the TTL on a quorum")
		none(t, holders(t, s, items[1].Key, "tok"), "a failed extension does not create the key")
	})

	t.Run("ExtendNeverShortensTheKey", func(t *testing.T) {
		s := setup(t)
		ctx := t.Context()
		keys := []string{"{short}:" + Key(t), "{short}:" + Key(t)}
		for _, key := range keys {
			_, err := s.Strategy.Acquire(ctx, key, "tok-a", 20*time.Second)
			must(t, err, "Acquire %s", key)
			if !eventually(func() bool { return holders(t, s, key, "tok-a") >= s.Quorum }, 2*time.Second) {
				t.Fatalf("%s: no quorum holds the key within 2s", key)
			}
		}
		// An extension to a shorter TTL is granted for that TTL, and the
		// key keeps the longer life it has: a late copy of an earlier,
		// shorter extension must never cut the key back below a later,
		// longer one's Until.
		before := time.Now()
		g, err := s.Strategy.Extend(ctx, keys[0], "tok-a", 5*time.Second)
		must(t, err, "a shorter extension of a held key is a success")
		check(t, !g.Until.After(before.Add(5*time.Second)), "Until %v must not exceed start+ttl", g.Until)
		checked := []string{keys[0]}
		if b, ok := s.Strategy.(redlease.BatchExtender); ok {
			out := b.ExtendBatch(ctx, []redlease.Extension{{Key: keys[1], Token: "tok-a", TTL: 5 * time.Second}})
			if len(out) != 1 {
				t.Fatalf("ExtendBatch: got %d results, want 1", len(out))
			}
			must(t, out[0].Err, "a shorter batch extension of a held key is a success")
			checked = append(checked, keys[1])
		}
		for _, key := range checked {
			// Both counts from one reading of each node: a node past the
			// quorum may take the grant's SET late (Acquire returned at a
			// majority), and two passes that read it before and after
			// counted it kept but not held.
			held, kept := holdersKept(t, s, key, "tok-a", 15*time.Second)
			check(t, held == kept, "%s: every node that holds the key keeps its 20 s: %d hold it, %d with more than 15 s", key, held, kept)
			atLeast(t, kept, s.Quorum, key)
		}
	})

	t.Run("ClusterSlotCompanions", func(t *testing.T) {
		s := setup(t)
		ctx := t.Context()
		// Keys with a hash tag keep it; keys without get one.
		for _, key := range []string{"{order:7}:lock:" + Key(t), Key(t)} {
			g, err := s.Strategy.Acquire(ctx, key, "tok", 5*time.Second)
			must(t, err, "Acquire %s", key)
			if s.Fencing {
				check(t, g.Fence != 0, "%s: a fenced grant without a fence", key)
			}
			must(t, s.Strategy.Release(ctx, key, "tok"), "Release %s", key)
		}
	})
}

// extendedOn counts the nodes where key holds token with more than ttl
// left on it (holdersKept's second count).
func extendedOn(t *testing.T, s Setup, key, token string, ttl time.Duration) int {
	t.Helper()
	_, kept := holdersKept(t, s, key, token, ttl)
	return kept
}

// holdersKept counts the nodes where key holds token, and those of them
// where it has more than ttl left, reading each node once (GET and PTTL in
// one MULTI).
func holdersKept(t *testing.T, s Setup, key, token string, ttl time.Duration) (held, kept int) {
	t.Helper()
	for _, c := range s.Nodes {
		var get *redis.StringCmd
		var pttl *redis.DurationCmd
		_, err := c.TxPipelined(context.Background(), func(p redis.Pipeliner) error {
			get, pttl = p.Get(context.Background(), key), p.PTTL(context.Background(), key)
			return nil
		})
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			t.Errorf("reading %s: %v", key, err)
			continue
		}
		if get.Val() == token {
			held++
			if pttl.Val() > ttl {
				kept++
			}
		}
	}
	return held, kept
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
			t.Errorf("reading %s: %v", key, err)
			continue
		}
		if v == token {
			n++
		}
	}
	return n
}

// must stops the test when err is not nil.
func must(t *testing.T, err error, format string, args ...any) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", fmt.Sprintf(format, args...), err)
	}
}

// check reports a failure, and lets the test go on, when ok is false.
func check(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Errorf(format, args...)
	}
}

// isErr reports a failure when err does not match target.
func isErr(t *testing.T, err, target error, format string, args ...any) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: got %v, want %v", fmt.Sprintf(format, args...), err, target)
	}
}

// atLeast reports a failure when got < want.
func atLeast(t *testing.T, got, want int, what string) {
	t.Helper()
	if got < want {
		t.Errorf("%s: got %d, want at least %d", what, got, want)
	}
}

// none reports a failure when got is not zero.
func none(t *testing.T, got int, what string) {
	t.Helper()
	if got != 0 {
		t.Errorf("%s: got %d, want 0", what, got)
	}
}

// eventually polls cond every millisecond until it holds or within has
// passed, and says whether it held.
func eventually(cond func() bool, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}
