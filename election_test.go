package redlease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// pausableClock reads the system clock until pause, and from then on the
// instant of the pause: the view of a process that stopped (GC, SIGSTOP)
// and does not know it.
type pausableClock struct {
	mu     sync.Mutex
	frozen time.Time
}

func (c *pausableClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.frozen.IsZero() {
		return c.frozen
	}
	return time.Now()
}

func (c *pausableClock) pause() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.frozen = time.Now()
}

// stuckKeeper is the keeper of a paused process: its renewals never go out.
type stuckKeeper struct{}

func (stuckKeeper) Keep(*redlease.Lock) func() { return func() {} }

// fencedRegister is storage that compares terms: it accepts a write only
// with a term at least the highest it accepted.
type fencedRegister struct {
	mu    sync.Mutex
	term  uint64
	value string
}

var errStaleTerm = errors.New("stale term")

func (r *fencedRegister) write(term uint64, v string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if term < r.term {
		return fmt.Errorf("%w: %d below %d", errStaleTerm, term, r.term)
	}
	r.term, r.value = term, v
	return nil
}

// observed is one leader an observer received, and when.
type observed struct {
	l  redlease.Leader
	at time.Time
}

// collect reads an Observe channel until it closes, recording what came.
func collect(ch <-chan redlease.Leader) (get func() []observed, done <-chan struct{}) {
	var mu sync.Mutex
	var seen []observed
	d := make(chan struct{})
	go func() {
		defer close(d)
		for l := range ch {
			mu.Lock()
			seen = append(seen, observed{l, time.Now()})
			mu.Unlock()
		}
	}()
	return func() []observed {
		mu.Lock()
		defer mu.Unlock()
		return append([]observed(nil), seen...)
	}, d
}

// TestElectionDeposesPausedLeader is issue 33's Must-show 2: a leader
// paused past its TTL (its renewals stuck, its clock stopped, so that it
// still believes it leads) is deposed; its write with its old term is
// refused by a fenced register and its Proclaim by the node; every
// observer sees the new leader within one TTL plus measured round trips
// after the old leader's grant.
func TestElectionDeposesPausedLeader(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	strategy, err := single.New(srv.Client())
	require.NoError(t, err)
	probe := redistest.StartStallProbe(t)
	ctx := t.Context()
	key := fmt.Sprintf("elect:%s:%d", t.Name(), time.Now().UnixNano())

	// The round trip, measured: the worst of a few reads of the election.
	const ttl = 500 * time.Millisecond
	// The observers poll only every 5 s (the max retry delay): within the
	// window below, only the new leader's notice can tell them.
	observer := newLocker(t, strategy, redlease.WithTTL(ttl), redlease.WithRetryDelay(time.Second, 5*time.Second))
	eo, err := redlease.NewElection(observer, key)
	require.NoError(t, err)
	var rtt time.Duration
	for range 5 {
		began := time.Now()
		_, err := eo.Leader(ctx)
		require.ErrorIs(t, err, redlease.ErrNoLeader)
		rtt = max(rtt, time.Since(began))
	}

	obsCtx, stopObs := context.WithCancel(ctx)
	var gets []func() []observed
	var dones []<-chan struct{}
	for range 3 {
		g, d := collect(eo.Observe(obsCtx))
		gets, dones = append(gets, g), append(dones, d)
	}
	t.Cleanup(func() {
		stopObs()
		for _, d := range dones {
			<-d
		}
	})

	clock := &pausableClock{}
	la := newLocker(t, strategy, redlease.WithTTL(ttl), redlease.WithKeeper(stuckKeeper{}), redlease.WithClock(clock))
	ea, err := redlease.NewElection(la, key)
	require.NoError(t, err)
	a, err := ea.Campaign(ctx, "A")
	aElected := time.Now()
	require.NoError(t, err)
	clock.pause() // A stops here: no renewal goes out, and its clock stands still
	var reg fencedRegister
	require.NoError(t, reg.write(a.Term(), "A1"))

	lb := newLocker(t, strategy, redlease.WithTTL(ttl))
	eb, err := redlease.NewElection(lb, key)
	require.NoError(t, err)
	b, err := eb.Campaign(ctx, "B")
	require.NoError(t, err)
	bElected := time.Now()
	t.Cleanup(func() { _ = b.Resign(context.WithoutCancel(ctx)) })
	require.Greater(t, b.Term(), a.Term(), "the new leader's term must be above the deposed one's")
	require.NoError(t, reg.write(b.Term(), "B1"))

	// A, paused, still believes it leads, or has learned it was deposed
	// from its record's refresh: that goroutine runs on the real clock
	// every TTL/3, and the refresh due about when A's key expired (500
	// ms) can land after B's election and be refused (make test failed
	// so once, s52: Valid false here). Either way its clock stood still,
	// so only a refusal can have told it, never its expiry; and its
	// writes are refused.
	if !a.Lock().Valid() {
		require.ErrorIs(t, a.Lock().Err(), redlease.ErrNotHeld, "a paused leader learns of its deposition only from a refusal")
		t.Logf("A learned of its deposition from its record's refresh before the check: %v", a.Lock().Err())
	}
	assert.ErrorIs(t, reg.write(a.Term(), "A2"), errStaleTerm, "the fenced register must refuse the deposed leader's term")
	err = a.Proclaim(ctx, "A-late")
	assert.ErrorIs(t, err, redlease.ErrNotHeld, "a deposed leader's Proclaim must be refused")
	got, err := eb.Leader(ctx)
	require.NoError(t, err)
	assert.Equal(t, redlease.Leader{Term: b.Term(), Value: "B"}, got, "the deposed leader's Proclaim must not overwrite the new leader's value")
	select {
	case <-a.Lost():
	default:
		t.Error("a Proclaim refused by the node must mark the leadership lost")
	}
	assert.Equal(t, "B1", reg.value)

	// B was elected within one TTL (A's key expires at most a TTL after A's
	// grant came back) plus round trips: B's retry, its grant and its
	// record.
	t.Logf("round trip %v, ttl %v, B elected %v after A", rtt, ttl, bElected.Sub(aElected))
	ok, why := probe.Within(bElected.Sub(aElected), ttl+4*rtt+5*time.Millisecond, 3, aElected)
	assert.True(t, ok, "B elected after A's grant: %s", why)

	// Every observer sees B, within one TTL plus round trips of A's grant
	// (B's record's publish, and each observer's read).
	bound := ttl + 6*rtt + 5*time.Millisecond
	for i, get := range gets {
		want := redlease.Leader{Term: b.Term(), Value: "B"}
		probe.WaitFor(t, bound, 3, time.Millisecond, func() bool {
			for _, o := range get() {
				if o.l == want {
					return true
				}
			}
			return false
		}, "observer %d sees B", i)
		var at time.Time
		var terms []uint64
		for _, o := range get() {
			terms = append(terms, o.l.Term)
			if o.l == want {
				at = o.at
			}
			assert.NotEqual(t, "A-late", o.l.Value, "observer %d saw the deposed leader's late value", i)
		}
		t.Logf("observer %d saw %d leaders, B %v after A's grant", i, len(terms), at.Sub(aElected))
		ok, why := probe.Within(at.Sub(aElected), bound, 3, aElected)
		assert.True(t, ok, "observer %d saw B after A's grant: %s", i, why)
		for j := 1; j < len(terms); j++ {
			assert.GreaterOrEqual(t, terms[j], terms[j-1], "observer %d: terms must rise: %v", i, terms)
		}
	}
}

// TestElectionRefusesQuorum: the quorum strategy holds no election.
func TestElectionRefusesQuorum(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Config{})
	q := quorumOver(t, directClients(t, servers), quorum.WithFencing())
	_, err := redlease.NewElection(newLocker(t, q), "elect:q")
	require.ErrorIs(t, err, redlease.ErrInvalid)
	_, err = redlease.NewElection(newLocker(t, singleNode(t)), "")
	require.ErrorIs(t, err, redlease.ErrInvalid)
	_, err = redlease.NewElection(nil, "k")
	require.ErrorIs(t, err, redlease.ErrInvalid)
}

// TestElectionBoundedOnPausedNode: with go-redis's default client options,
// a paused node makes Leader return ErrUnavailable within the call bound
// (never a leader), and an Observe whose ctx ends closes its channel
// within its poll, while the node stays paused.
func TestElectionBoundedOnPausedNode(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	strategy, err := single.New(srv.Client())
	require.NoError(t, err)
	probe := redistest.StartStallProbe(t)
	l := newLocker(t, strategy, redlease.WithTTL(10*time.Second))
	e, err := redlease.NewElection(l, "elect:paused")
	require.NoError(t, err)
	ld, err := e.Campaign(t.Context(), "A")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ld.Resign(context.Background()) })
	obsCtx, stopObs := context.WithCancel(t.Context())
	obs := e.Observe(obsCtx)
	require.Equal(t, redlease.Leader{Term: ld.Term(), Value: "A"}, <-obs)

	srv.Pause()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			srv.Resume()
		}
	}
	t.Cleanup(resume)
	began := time.Now()
	_, err = e.Leader(t.Context())
	took := time.Since(began)
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	require.NotErrorIs(t, err, redlease.ErrNoLeader)
	ok, why := probe.Within(took, redlease.DefaultCallBound+50*time.Millisecond, 3, began)
	assert.True(t, ok, "Leader on a paused node: %s", why)

	began = time.Now()
	stopObs()
	for range obs { // drains, then ends when the goroutine closes it
	}
	ok, why = probe.Within(time.Since(began), redlease.DefaultCallBound+redlease.DefaultMaxRetryDelay+50*time.Millisecond, 3, began)
	assert.True(t, ok, "Observe's channel closed after its ctx ended: %s", why)
	resume()
}
