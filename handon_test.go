package redlease_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
)

// wakerFake is the fake Strategy with a Waker whose notices the test
// sends by hand; stop's handOn argument is reported on stops.
type wakerFake struct {
	*fake
	notices chan struct{}
	waiters chan string // Watch's waiter argument
	stops   chan bool
	// during, if set, runs inside the next Acquire (then is cleared).
	during func()
	// listening: Listen finds the key's subscription live.
	listening bool
	watches   int // Watch calls
}

func (w *wakerFake) Acquire(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	w.mu.Lock()
	during := w.during
	w.during = nil
	w.mu.Unlock()
	if during != nil {
		during()
	}
	return w.fake.Acquire(ctx, key, token, ttl)
}

func newWakerFake() *wakerFake {
	return &wakerFake{fake: newFake(), notices: make(chan struct{}, 1), waiters: make(chan string, 1), stops: make(chan bool, 1)}
}

// Listen reports the subscription live only if listening is set.
func (w *wakerFake) Listen(key, waiter string) (<-chan struct{}, func(bool), bool) {
	if !w.listening {
		return nil, nil, false
	}
	w.waiters <- waiter
	return w.notices, func(handOn bool) { w.stops <- handOn }, true
}

func (w *wakerFake) Watch(ctx context.Context, key, waiter string) (<-chan struct{}, func(bool), error) {
	w.mu.Lock()
	w.watches++
	w.mu.Unlock()
	w.waiters <- waiter
	return w.notices, func(handOn bool) { w.stops <- handOn }, nil
}

// A release wakes one waiter of the process (Waker); a waiter that leaves
// owing its notice must hand it on, or the key sits free until the other
// waiters' backoff. Each case holds the key under another token, starts a
// Lock that waits an hour between attempts, and forces one order of
// events; stop's handOn must say whether a notice went unanswered.
func TestAWaiterLeavingWithAnUnansweredNoticeHandsItOn(t *testing.T) {
	unavailable := redlease.ErrUnavailable // as the strategies answer an attempt nodes failed
	cases := []struct {
		name string
		// after the waiter is asleep in its backoff: what happens, and
		// what stop must be told
		run  func(w *wakerFake, cancel context.CancelFunc)
		want bool
	}{
		{"woken, attempt refused, then gives up: answered", func(w *wakerFake, cancel context.CancelFunc) {
			w.notices <- struct{}{}
			synctest.Wait()
			cancel()
		}, false},
		{"woken, attempt failed on the way, then gives up: unanswered", func(w *wakerFake, cancel context.CancelFunc) {
			w.mu.Lock()
			w.failNext = []error{unavailable}
			w.mu.Unlock()
			w.notices <- struct{}{}
			synctest.Wait()
			cancel()
		}, true},
		{"woken, gives up while its attempt is refused: unanswered (the refusal may come from a call cut short)", func(w *wakerFake, cancel context.CancelFunc) {
			w.mu.Lock()
			w.during = cancel
			w.mu.Unlock()
			w.notices <- struct{}{}
		}, true},
		{"gives up with the notice arriving: unanswered", func(w *wakerFake, cancel context.CancelFunc) {
			cancel()
			w.notices <- struct{}{}
		}, true},
		{"woken and granted: nothing to hand on", func(w *wakerFake, cancel context.CancelFunc) {
			w.mu.Lock()
			delete(w.held, "k")
			w.mu.Unlock()
			w.notices <- struct{}{}
		}, false},
		{"gives up asleep, no notice: nothing to hand on", func(w *wakerFake, cancel context.CancelFunc) {
			cancel()
		}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for range 3 {
				synctest.Test(t, func(t *testing.T) {
					w := newWakerFake()
					w.held["k"] = holder{"someone-else", time.Now().Add(24 * time.Hour)}
					l, err := redlease.New(w, redlease.WithRetryDelay(time.Hour, time.Hour), redlease.WithFairness(false))
					require.NoError(t, err)
					ctx, cancel := context.WithCancel(t.Context())
					defer cancel()
					done := make(chan error, 1)
					go func() {
						lk, err := l.Lock(ctx, "k")
						if err == nil {
							err = lk.Release(context.Background())
						}
						done <- err
					}()
					require.Equal(t, "", <-w.waiters, "a Lock without fairness watches as waiter \"\"")
					synctest.Wait() // asleep in its backoff
					tc.run(w, cancel)
					err = <-done
					if err != nil {
						// Held, or the attempt failed on the way: both
						// are retried, neither is a grant.
						require.True(t, errors.Is(err, redlease.ErrNotObtained) || errors.Is(err, redlease.ErrUnavailable), "%v", err)
					}
					require.Equal(t, tc.want, <-w.stops, "stop's handOn")
				})
			}
		})
	}
}

// In fair mode the waiter watches under its id in the line, which is what
// a release names.
func TestAFairWaiterWatchesUnderItsIDInTheLine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := &queuedWaker{wakerFake: newWakerFake()}
		w.held["k"] = holder{"someone-else", time.Now().Add(24 * time.Hour)}
		l, err := redlease.New(w, redlease.WithRetryDelay(time.Hour, time.Hour), redlease.WithFairness(true))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_, _ = l.Lock(ctx, "k")
		}()
		waiter := <-w.waiters
		synctest.Wait()
		cancel()
		<-done
		<-w.stops
		require.NotEmpty(t, waiter)
		require.Equal(t, w.placeID, waiter, "Watch's waiter is the Place's id")
	})
}

// queuedWaker is a wakerFake that is also a Queuer and records its
// waiter's place id.
type queuedWaker struct {
	*wakerFake
	placeID string
}

func (q *queuedWaker) AcquireInLine(ctx context.Context, key, token string, ttl time.Duration, p redlease.Place) (redlease.Grant, error) {
	q.mu.Lock()
	q.placeID = p.ID
	q.mu.Unlock()
	return q.Acquire(ctx, key, token, ttl)
}

func (q *queuedWaker) LeaveLine(ctx context.Context, key, id string) error { return nil }

// On a key whose releases the process already hears (Waker.Listen), Lock
// subscribes before its first check and waits after one refused attempt;
// otherwise it checks, subscribes (Watch) and checks again.
func TestLockJoinsALiveSubscriptionBeforeItsFirstCheck(t *testing.T) {
	for _, live := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			w := newWakerFake()
			w.listening = live
			w.held["k"] = holder{"someone-else", time.Now().Add(24 * time.Hour)}
			l, err := redlease.New(w, redlease.WithRetryDelay(time.Hour, time.Hour))
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan struct{})
			go func() {
				defer close(done)
				_, _ = l.Lock(ctx, "k")
			}()
			<-w.waiters
			synctest.Wait() // asleep
			w.mu.Lock()
			attempts, watches := len(w.acquires), w.watches
			w.mu.Unlock()
			cancel()
			<-done
			<-w.stops
			if live {
				require.Equal(t, 1, attempts, "live subscription: one check, after subscribing")
				require.Zero(t, watches)
			} else {
				require.Equal(t, 2, attempts, "check, subscribe, check again")
				require.Equal(t, 1, watches)
			}
		})
	}
}
