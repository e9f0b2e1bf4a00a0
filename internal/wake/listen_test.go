package wake

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/backoff"
	"github.com/redlease/redlease/internal/redistest"
)

// Listen joins a subscription only if it is already confirmed (kept by
// another waiter); a held SUBSCRIBE (a gate) keeps it unconfirmed, and
// Listen must then refuse, since a release published before the server
// subscribes would be missed. Once joined, the process's notices go to
// the longest waiting, and a hand-on reaches the listener.
func TestListenJoinsOnlyAConfirmedSubscription(t *testing.T) {
	probe := redistest.StartStallProbe(t)
	srv := redistest.Start(t, redistest.Config{})
	g := redistest.NewGate(t, srv.Addr)
	c := redis.NewClient(&redis.Options{Addr: g.Addr})
	t.Cleanup(func() { _ = c.Close() })
	s := NewSet(c)
	t.Cleanup(func() { s.Close(time.Second) })
	const ch = "redlease:wake:{k}"

	_, _, ok := s.Listen(t.Context(), ch, "", 1)
	require.False(t, ok, "nobody subscribed")

	g.HoldRequests("subscribe")
	first := make(chan struct {
		notices <-chan struct{}
		stop    func(bool)
	}, 1)
	go func() {
		n, stop, err := s.Watch(t.Context(), ch, "", 1, time.Minute)
		if err == nil {
			first <- struct {
				notices <-chan struct{}
				stop    func(bool)
			}{n, stop}
		}
	}()
	require.NoError(t, g.WaitHeld(1, "subscribe", 10*time.Second))
	_, _, ok = s.Listen(t.Context(), ch, "", 1)
	require.False(t, ok, "SUBSCRIBE not confirmed yet")
	g.HoldRequests("")
	g.Open()
	w1 := redistest.Await(t, probe, first, 10*time.Second, 3, "Watch not confirmed: %s", redistest.Lazy(func() string { return hubState(c) }))

	seeded := backoff.WithSeed(t.Context(), 7)
	n2, stop2, ok := s.Listen(seeded, ch, "", 1)
	require.True(t, ok, "confirmed by the first waiter: %s", hubState(c))
	requireJitterFrom(t, seeded, s, n2)
	_, _, ok = s.Listen(t.Context(), "redlease:wake:{other}", "", 1)
	require.False(t, ok, "another channel")

	admin := srv.Client()
	t.Cleanup(func() { _ = admin.Close() })
	require.NoError(t, admin.Publish(t.Context(), ch, "").Err())
	redistest.Await(t, probe, w1.notices, 10*time.Second, 3, "the longest-waiting waiter was not woken")
	require.Empty(t, n2, "one waiter woken per release")
	w1.stop(true) // leaves without answering: hand on
	redistest.Await(t, probe, n2, 10*time.Second, 3, "the hand-on did not reach the listener")
	stop2(false)
}

// requireJitterFrom checks that the waiter of s whose notices are n draws
// its undo pauses from ctx (its seed), as a Watch's waiter does: a
// listener's used to come from math/rand/v2's global source, which no
// seed decides (chaos/sim's wake-herd replays differed run to run).
func requireJitterFrom(t *testing.T, ctx context.Context, s *Set, n <-chan struct{}) {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	want := backoff.NewStream(ctx, undoTag)
	for sub := range s.subs {
		if sub.notify == n {
			for i := 1; i <= 3; i++ {
				require.Equal(t, backoff.Jittered(want, i, undoBase, undoMax), backoff.Jittered(sub.jitter, i, undoBase, undoMax),
					"pause %d of a listener's undo notices: not drawn from its context's seed", i)
			}
			return
		}
	}
	t.Fatal("the listener is not among the Set's waiters")
}
