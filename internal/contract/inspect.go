package contract

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/script"
)

// runInspect is the suite's part for the optional powers of an operator:
// Inspector and ForceReleaser, each skipped on a strategy without it.
func runInspect(t *testing.T, setup func(t *testing.T) Setup) {
	t.Run("Inspect", func(t *testing.T) {
		s := setup(t)
		in, ok := s.Strategy.(redlease.Inspector)
		if !ok {
			t.Skipf("%T is not an Inspector", s.Strategy)
		}
		ctx, key := t.Context(), Key(t)
		v, err := in.Inspect(ctx, key)
		must(t, err, "Inspect of a free key")
		check(t, v.State == redlease.KeyFree && v.Token == "" && v.Free == len(s.Nodes) && v.Answered == len(s.Nodes),
			"a key nobody took: got %+v", v)
		check(t, len(v.Nodes) == len(s.Nodes), "one view per node: got %d, want %d", len(v.Nodes), len(s.Nodes))

		g, err := s.Strategy.Acquire(ctx, key, "tok-a", 5*time.Second)
		must(t, err, "Acquire")
		if !eventually(func() bool { return holders(t, s, key, "tok-a") >= s.Quorum }, 2*time.Second) {
			t.Fatalf("no quorum holds the key within 2s")
		}
		// A record as `redlease run` leaves one beside its grant.
		since := time.Now().UTC().Truncate(time.Microsecond)
		for _, n := range s.Nodes {
			must(t, n.HSet(ctx, script.HolderKey(key), "token", "tok-a", "host", "h1", "pid", "42",
				"start", since.Format(time.RFC3339Nano), "command", "settle", "fence", fmt.Sprint(g.Fence)).Err(), "HSET")
		}
		v, err = in.Inspect(ctx, key)
		must(t, err, "Inspect of a held key")
		check(t, v.State == redlease.KeyHeld && v.Token == "tok-a" && v.Holding >= s.Quorum,
			"held by tok-a on a quorum: got %s by %q on %d", v.State, v.Token, v.Holding)
		check(t, v.Remaining > 0 && v.Remaining <= 5*time.Second, "remaining %v: in (0, 5s]", v.Remaining)
		switch {
		case !s.Fencing:
			check(t, v.Fence == 0, "fence %d without fencing", v.Fence)
		case s.Quorum == 1:
			check(t, v.Fence == g.Fence, "fence %d: the holder's is %d", v.Fence, g.Fence)
		default:
			// A node that granted after the round was decided counted
			// from its own clock, maybe higher.
			check(t, v.Fence >= g.Fence, "fence %d: at least the holder's %d", v.Fence, g.Fence)
		}
		check(t, v.Holder != nil && v.Holder.PID == 42 && v.Holder.Host == "h1" && v.Holder.Command == "settle" &&
			v.Holder.Fence == g.Fence, "the holder's record: got %+v", v.Holder)
		check(t, v.Since.Equal(since), "since %v, want %v (from the record)", v.Since, since)

		// A record that names another token is not the holder's.
		for _, n := range s.Nodes {
			must(t, n.HSet(ctx, script.HolderKey(key), "token", "tok-old").Err(), "HSET")
		}
		v, err = in.Inspect(ctx, key)
		must(t, err, "Inspect")
		check(t, v.Holder == nil && v.Since.IsZero(), "a stale record is nobody's: got %+v, since %v", v.Holder, v.Since)

		if q, ok := s.Strategy.(redlease.Queuer); ok {
			place := redlease.Place{ID: "waiter", Ticket: time.Now(), Join: true, Lifetime: 5 * time.Second}
			_, err := q.AcquireInLine(ctx, key, "waiter.1", 5*time.Second, place)
			isErr(t, err, redlease.ErrNotObtained, "a fair waiter behind the holder")
			v, err = in.Inspect(ctx, key)
			must(t, err, "Inspect")
			check(t, v.Waiters == 1, "one waiter in line: got %d", v.Waiters)
			must(t, q.LeaveLine(ctx, key, "waiter"), "LeaveLine")
		}
		check(t, !changedBy(t, s, in, key), "Inspect writes nothing")

		for _, bad := range []string{"", "a}b", redlease.ReservedPrefix + "fence:{x}"} {
			_, err := in.Inspect(ctx, bad)
			isErr(t, err, redlease.ErrInvalid, "Inspect(%q)", bad)
		}

		if len(s.Nodes) > 1 {
			// Each node holding a token of its own: no majority either way.
			split := Key(t)
			for i, n := range s.Nodes {
				must(t, n.Set(ctx, split, fmt.Sprintf("tok-%d", i), 5*time.Second).Err(), "SET")
			}
			v, err = in.Inspect(ctx, split)
			must(t, err, "Inspect of a split key")
			check(t, v.State == redlease.KeySplit && v.Token == "tok-0" && v.Holding == 1,
				"split: got %s by %q on %d", v.State, v.Token, v.Holding)
		}
	})

	t.Run("ForceRelease", func(t *testing.T) {
		s := setup(t)
		fr, ok := s.Strategy.(redlease.ForceReleaser)
		if !ok {
			t.Skipf("%T is not a ForceReleaser", s.Strategy)
		}
		ctx, key := t.Context(), Key(t)
		g, err := s.Strategy.Acquire(ctx, key, "tok-a", 5*time.Second)
		must(t, err, "Acquire")
		if !eventually(func() bool { return holders(t, s, key, "tok-a") >= s.Quorum }, 2*time.Second) {
			t.Fatalf("no quorum holds the key within 2s")
		}
		r, err := fr.ForceRelease(ctx, key, "tok-b")
		isErr(t, err, redlease.ErrNotHeld, "ForceRelease of a token that does not hold the key")
		check(t, r.Deleted == 0 && len(r.Nodes) == len(s.Nodes), "nothing deleted, every node reported: got %+v", r)
		atLeast(t, holders(t, s, key, "tok-a"), s.Quorum, "the holder's key left alone")

		var notices <-chan struct{}
		if w, ok := s.Strategy.(redlease.Waker); ok {
			ch, stop, err := w.Watch(ctx, key, "w")
			must(t, err, "Watch")
			defer stop(false)
			notices = ch
		}
		r, err = fr.ForceRelease(ctx, key, "tok-a")
		must(t, err, "ForceRelease of the holder's token")
		atLeast(t, r.Deleted, s.Quorum, "nodes that deleted it")
		check(t, holders(t, s, key, "tok-a") < s.Quorum, "the holder keeps no quorum")
		for i, n := range r.Nodes {
			check(t, n.Node == i && n.Err == nil, "node %d: %+v", i, n)
		}
		_, err = s.Strategy.Extend(ctx, key, "tok-a", 5*time.Second)
		isErr(t, err, redlease.ErrNotHeld, "the revoked holder's next renewal")
		if notices != nil {
			select {
			case <-notices:
			case <-time.After(2 * time.Second):
				t.Errorf("no release notice within 2s of the forced release")
			}
		}
		g2, err := s.Strategy.Acquire(ctx, key, "tok-c", 5*time.Second)
		must(t, err, "Acquire after the forced release")
		if s.Fencing {
			check(t, g2.Fence > g.Fence, "the next fence %d above the revoked holder's %d", g2.Fence, g.Fence)
		}
		_, err = fr.ForceRelease(ctx, key, "tok-a")
		isErr(t, err, redlease.ErrNotHeld, "a second forced release of the revoked token")

		for _, c := range []struct{ key, token string }{{"", "tok"}, {key, ""}, {"a}b", "tok"}, {redlease.ReservedPrefix + "x", "tok"}} {
			_, err := fr.ForceRelease(ctx, c.key, c.token)
			isErr(t, err, redlease.ErrInvalid, "ForceRelease(%q, %q)", c.key, c.token)
		}
	})

	// The safety rule of operator work: a forced release must not match
	// what later work created. The key changes hands between the look
	// and the force; the force deletes nothing.
	t.Run("ForceReleaseAfterHandOver", func(t *testing.T) {
		s := setup(t)
		fr, ok := s.Strategy.(redlease.ForceReleaser)
		if !ok {
			t.Skipf("%T is not a ForceReleaser", s.Strategy)
		}
		ctx := t.Context()
		for _, c := range []struct {
			name    string
			release bool   // the holder the operator saw released the key before the next took it
			next    string // the next holder's token
		}{
			{"released, then taken by another", true, "next.1"},
			// A later attempt of the same acquisition, which the acquire
			// script lets take over the key from an earlier one.
			{"taken over by a later attempt", false, "seen.2"},
		} {
			key := Key(t)
			_, err := s.Strategy.Acquire(ctx, key, "seen.1", 5*time.Second)
			must(t, err, "%s: Acquire by the holder the operator saw", c.name)
			if c.release {
				must(t, s.Strategy.Release(ctx, key, "seen.1"), "Release")
				if !eventually(func() bool { return holders(t, s, key, "seen.1") == 0 }, 2*time.Second) {
					t.Fatalf("%s: the released key is still there after 2s", c.name)
				}
			}
			_, err = s.Strategy.Acquire(ctx, key, c.next, 5*time.Second)
			must(t, err, "%s: Acquire by %s", c.name, c.next)
			if !eventually(func() bool { return holders(t, s, key, c.next) >= s.Quorum }, 2*time.Second) {
				t.Fatalf("%s: no quorum holds the key within 2s", c.name)
			}
			r, err := fr.ForceRelease(ctx, key, "seen.1")
			// The takeover may not have reached a node past the quorum:
			// "seen.1" may be deleted there, never the next holder's key.
			if c.release || r.Deleted == 0 {
				isErr(t, err, redlease.ErrNotHeld, "%s: ForceRelease of the token seen before", c.name)
			}
			atLeast(t, holders(t, s, key, c.next), s.Quorum, c.name+": the new holder keeps the key")
			_, err = s.Strategy.Extend(ctx, key, c.next, 5*time.Second)
			must(t, err, "%s: the new holder renews", c.name)
		}
	})
}

// changedBy reports whether an Inspect of key changed anything on the
// nodes: it compares every node's DUMP of the key, its fence counter and
// its line, taken before and after.
func changedBy(t *testing.T, s Setup, in redlease.Inspector, key string) bool {
	t.Helper()
	keys := []string{key, script.MustFenceKey(key), script.QueueKey(key), script.HolderKey(key)}
	dump := func() []string {
		var out []string
		for _, n := range s.Nodes {
			for _, k := range keys {
				v, err := n.Dump(context.Background(), k).Result()
				if err != nil && !errors.Is(err, redis.Nil) {
					t.Errorf("DUMP %s: %v", k, err)
				}
				out = append(out, v)
			}
		}
		return out
	}
	before := dump()
	if _, err := in.Inspect(t.Context(), key); err != nil {
		t.Errorf("Inspect: %v", err)
	}
	after := dump()
	return fmt.Sprint(before) != fmt.Sprint(after)
}
