package wake

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hubState is a description of the hub of c, for failure messages.
func hubState(c redis.UniversalClient) string {
	mu.Lock()
	defer mu.Unlock()
	h := hubs[registryKey(c)]
	if h == nil {
		return "no hub"
	}
	s := fmt.Sprintf("pending %v;", h.pending)
	for ch, e := range h.chans {
		s += fmt.Sprintf(" %s{confirmed %v err %v waiters %d}", ch, e.confirmed, e.err, len(e.subs))
	}
	return s
}

// waitRegistered waits until the hub of c has an entry for every channel,
// for 10 s plus 3 × what probe measured this process stalled meanwhile.
func waitRegistered(t *testing.T, probe *redistest.StallProbe, c redis.UniversalClient, channels ...string) {
	t.Helper()
	probe.WaitFor(t, 10*time.Second, 3, time.Millisecond, func() bool {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		if h := hubs[registryKey(c)]; h != nil {
			for _, ch := range channels {
				if h.chans[ch] != nil {
					n++
				}
			}
		}
		return n == len(channels)
	}, "channels %v not registered: %s", channels, redistest.Lazy(func() string { return hubState(c) }))
}

// watchIn runs Watch in a goroutine; the channel receives its channel
// name when Watch returns. The subscription ends with the test.
func watchIn(t *testing.T, s *Set, channel string, bound time.Duration) <-chan string {
	done := make(chan string, 1)
	ctx := t.Context()
	go func() {
		_, stop, err := s.Watch(ctx, channel, "", 1, bound)
		if err == nil {
			defer stop(false)
		}
		done <- channel
		<-ctx.Done()
	}()
	return done
}

// A SUBSCRIBE of several channels that the server refuses (NOPERM: an
// ACL without the wake channels, Redis 7's default for a new user) gets
// ONE error reply. Every channel of that command has failed, and every
// waiter on them must be told at once (the doc: a refused subscription
// costs the waiter nothing but the notice). Schedule: the hub's first
// connection is held in its handshake (HELLO kept at a gate), so that the
// waiters on "a", "b" and "c" arrive while the writer cannot send; the
// writer then sends at most two SUBSCRIBE commands for three channels,
// one of them with two channels or more.
func TestRefusedSubscribeOfSeveralChannelsFailsEachOfThem(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	admin := srv.Client()
	t.Cleanup(func() { _ = admin.Close() })
	if err := admin.Do(t.Context(), "ACL", "SETUSER", "nochan", "on", ">pw", "~*", "resetchannels", "&other:*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	g := redistest.NewGate(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: g.Addr, Username: "nochan", Password: "pw"})
	t.Cleanup(func() { _ = c.Close() })
	s := NewSet(c)
	t.Cleanup(func() { s.Close(time.Second) })

	probe := redistest.StartStallProbe(t)
	g.HoldRequests("hello")
	const bound = time.Minute // nothing here may wait for it
	start := time.Now()
	results := []<-chan string{watchIn(t, s, "redlease:wake:a", bound)}
	if err := g.WaitHeld(1, "hello", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	results = append(results, watchIn(t, s, "redlease:wake:b", bound), watchIn(t, s, "redlease:wake:c", bound))
	waitRegistered(t, probe, c, "redlease:wake:a", "redlease:wake:b", "redlease:wake:c")
	g.HoldRequests("")
	g.Open()

	for _, r := range results {
		channel := redistest.Await(t, probe, r, 10*time.Second, 3, "a Watch refused by the server still waits after the refusal (it would wait for its bound, %v): %s", bound, redistest.Lazy(func() string { return hubState(c) }))
		// However long the window the run allowed, a Watch that returned
		// at its bound was not told of the refusal.
		require.Less(t, time.Since(start), bound, "Watch on %s returned at its bound, not at the refusal", channel)
	}
}

// Close ends the subscriptions made through the Set and wakes their
// waiters, also a waiter still inside Watch, waiting for a confirmation
// (here the SUBSCRIBE is kept at a gate: the node is slow to answer).
// Watch must return at Close, not at its bound.
func TestCloseEndsAWatchWaitingForItsConfirmation(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	g := redistest.NewGate(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: g.Addr})
	t.Cleanup(func() { _ = c.Close() })
	s := NewSet(c)

	probe := redistest.StartStallProbe(t)
	g.HoldRequests("subscribe")
	const bound = time.Minute
	start := time.Now()
	res := watchIn(t, s, "redlease:wake:k", bound)
	if err := g.WaitHeld(1, "subscribe", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	s.Close(time.Second)
	redistest.Await(t, probe, res, 10*time.Second, 3, "Watch still waiting after Close (it would wait for its bound, %v): %s", bound, redistest.Lazy(func() string { return hubState(c) }))
	// However long the window the run allowed, a Watch that returned at its
	// bound was not ended by Close.
	require.Less(t, time.Since(start), bound, "Watch returned at its bound, not at Close")
	g.HoldRequests("")
	g.Open()
	if _, _, err := s.Watch(context.Background(), "redlease:wake:k", "", 1, bound); err != ErrClosed {
		t.Fatalf("Watch after Close: got %v, want ErrClosed", err)
	}
}
