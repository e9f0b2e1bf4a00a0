package wake

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
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

// waitRegistered waits until the hub of c has an entry for every channel.
func waitRegistered(t *testing.T, c redis.UniversalClient, channels ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := 0
		if h := hubs[registryKey(c)]; h != nil {
			for _, ch := range channels {
				if h.chans[ch] != nil {
					n++
				}
			}
		}
		mu.Unlock()
		if n == len(channels) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("channels %v not registered: %s", channels, hubState(c))
		}
		time.Sleep(time.Millisecond)
	}
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

	g.HoldRequests("hello")
	const bound = time.Minute // nothing here may wait for it
	results := []<-chan string{watchIn(t, s, "redlease:wake:a", bound)}
	if err := g.WaitHeld(1, "hello", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	results = append(results, watchIn(t, s, "redlease:wake:b", bound), watchIn(t, s, "redlease:wake:c", bound))
	waitRegistered(t, c, "redlease:wake:a", "redlease:wake:b", "redlease:wake:c")
	g.HoldRequests("")
	g.Open()

	for _, r := range results {
		select {
		case <-r:
		case <-time.After(10 * time.Second):
			t.Fatalf("a Watch refused by the server still waits 10 s after the refusal (it would wait for its bound, %v): %s", bound, hubState(c))
		}
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

	g.HoldRequests("subscribe")
	const bound = time.Minute
	res := watchIn(t, s, "redlease:wake:k", bound)
	if err := g.WaitHeld(1, "subscribe", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	s.Close(time.Second)
	select {
	case <-res:
	case <-time.After(10 * time.Second):
		t.Fatalf("Watch still waiting 10 s after Close (it would wait for its bound, %v): %s", bound, hubState(c))
	}
	g.HoldRequests("")
	g.Open()
	if _, _, err := s.Watch(context.Background(), "redlease:wake:k", "", 1, bound); err != ErrClosed {
		t.Fatalf("Watch after Close: got %v, want ErrClosed", err)
	}
}
