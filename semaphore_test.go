package redlease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
)

// TestSemaphoreBoundWithKilledHoldersOnSingle and ...OnQuorum: N = 3
// permits, 32 contending goroutines, one call in six a holder "killed"
// (its permit taken through a Locker without a keeper, never renewed nor
// released, as by a process that crashed). Never more than 3 permits
// believed held at once (Lock.Valid, counted on every entry), and a dead
// holder's slot granted again within its TTL after its grant plus the
// backoff bound of the run.
func TestSemaphoreBoundWithKilledHoldersOnSingle(t *testing.T) {
	t.Parallel()
	semaphoreBound(t, singleNode(t))
}

func TestSemaphoreBoundWithKilledHoldersOnQuorum(t *testing.T) {
	t.Parallel()
	servers := redistest.StartN(t, 3, redistest.Config{})
	semaphoreBound(t, quorumOver(t, directClients(t, servers)))
}

// belief is one permit handed out in semaphoreBound: believed held from
// entry until its holder left (never, for a dead one) or its lock stopped
// being Valid.
type belief struct {
	lk       *redlease.Lock
	dead     bool
	granted  time.Time // when Acquire returned it
	left     bool
	grantSeq int
}

// beliefs is semaphoreBound's record of every permit handed out.
type beliefs struct {
	mu       sync.Mutex
	all      []*belief
	most     int // most believed held at once, counted at entries
	examined int // entries counted
	over     []string
}

// enter records a permit handed out and counts the permits believed
// held with it (its own included, if it is valid).
func (b *beliefs) enter(lk *redlease.Lock, dead bool, n int) *belief {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := &belief{lk: lk, dead: dead, granted: time.Now(), grantSeq: len(b.all)}
	b.all = append(b.all, e)
	in := 0
	for _, o := range b.all {
		if !o.left && o.lk.Valid() {
			in++
		}
	}
	b.examined++
	b.most = max(b.most, in)
	if in > n && len(b.over) < 5 {
		b.over = append(b.over, fmt.Sprintf("%d permits believed held at once on entry of %s", in, lk.Key()))
	}
	return e
}

func (b *beliefs) leave(e *belief) {
	b.mu.Lock()
	e.left = true
	b.mu.Unlock()
}

// slowest is an Observer that keeps the longest "acquire" (one attempt on
// one slot) of the run.
type slowest struct{ d atomic.Int64 }

func (s *slowest) Start(ctx context.Context, op redlease.Op) (context.Context, func(error)) {
	if op.Name != "acquire" {
		return ctx, func(error) {}
	}
	began := time.Now()
	return ctx, func(error) {
		took := int64(time.Since(began))
		for {
			old := s.d.Load()
			if took <= old || s.d.CompareAndSwap(old, took) {
				return
			}
		}
	}
}
func (*slowest) Held(redlease.Op, time.Duration, error)                       {}
func (*slowest) NodeFailed(context.Context, redlease.Op, *redlease.NodeError) {}

func semaphoreBound(t *testing.T, s redlease.Strategy) {
	const (
		n, workers, runs = 3, 32, 6
		ttl              = 300 * time.Millisecond
		maxDelay         = 40 * time.Millisecond
	)
	probe := redistest.StartStallProbe(t)
	began := time.Now()
	slow := &slowest{}
	opts := []redlease.Option{redlease.WithTTL(ttl), redlease.WithRetryDelay(2*time.Millisecond, maxDelay), redlease.WithObserver(slow)}
	live := newLocker(t, s, append(opts, redlease.WithKeeper(watchdog(t)))...)
	dead := newLocker(t, s, append(opts, redlease.WithoutKeeper())...)
	liveSem, err := live.Semaphore("sem:partner-bank", n)
	require.NoError(t, err)
	deadSem, err := dead.Semaphore("sem:partner-bank", n)
	require.NoError(t, err)

	// room is how long a renewal has between its interval (a third of
	// the TTL) and the deadline (the TTL less the loss margin, a tenth).
	room := ttl - ttl/3 - ttl/10
	var excused atomic.Int64
	var b beliefs
	var wg sync.WaitGroup
	var firstErr error
	var once sync.Once
	fail := func(err error) { once.Do(func() { firstErr = err }) }
	for w := range workers {
		wg.Go(func() {
			for i := range runs {
				ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
				if (w*runs+i)%6 == 0 {
					// Killed: holds its permit until its TTL ends it.
					lk, err := deadSem.Acquire(ctx)
					cancel()
					if err != nil {
						fail(fmt.Errorf("worker %d run %d (killed): %w", w, i, err))
						return
					}
					b.enter(lk, true, n)
					continue
				}
				doStart := time.Now()
				err := liveSem.Do(ctx, func(ctx context.Context, lk *redlease.Lock) error {
					e := b.enter(lk, false, n)
					time.Sleep(time.Duration(1+(w+i)%10) * time.Millisecond)
					b.leave(e)
					return nil
				})
				cancel()
				// A live permit lost for want of a renewal in time (a 300
				// ms TTL on a loaded machine: make test failed so twice,
				// s52, on quorum beside the simulator's and a mutant
				// table's workers, "validity ... ran out without an
				// extension", once with no stall the probe measured)
				// breaks no bound: a lost permit is not believed held.
				// It is counted, with the longest stall measured
				// meanwhile, and at most a quarter of the live runs may
				// end so, or the test examined too little.
				if errors.Is(err, redlease.ErrLost) {
					t.Logf("worker %d run %d lost its permit (longest stall measured meanwhile %v, a renewal's room %v): %v", w, i, probe.Worst(doStart, time.Now()), room, err)
					excused.Add(1)
					continue
				}
				if err != nil {
					fail(fmt.Errorf("worker %d run %d: %w", w, i, err))
					return
				}
			}
		})
	}
	wg.Wait()
	require.NoError(t, firstErr)
	b.mu.Lock()
	defer b.mu.Unlock()
	assert.Empty(t, b.over, "more than %d permits believed held", n)
	assert.LessOrEqual(t, b.most, n)
	assert.Equal(t, workers*runs, b.examined, "entries counted")
	liveRuns := int64(workers * runs * 5 / 6)
	assert.LessOrEqual(t, 4*excused.Load(), liveRuns, "live permits lost: %d of %d", excused.Load(), liveRuns)
	t.Logf("%d entries examined, at most %d permits believed held at once; %d of %d live permits lost for want of a renewal", b.examined, b.most, excused.Load(), liveRuns)

	// A dead permit's slot comes back: the next grant of its slot comes
	// no later than its TTL after it was granted, plus the wait of a
	// waiter (the max retry delay; cut at the dead key's remaining TTL
	// + 1 ms) and a round of N attempts at the slowest attempt of the
	// run, plus 3 times what this process was measured stalled.
	bound := maxDelay + time.Duration(n)*time.Duration(slow.d.Load()) + 5*time.Millisecond
	checked, deads := 0, 0
	for i, e := range b.all {
		if !e.dead {
			continue
		}
		deads++
		j := slices.IndexFunc(b.all[i+1:], func(o *belief) bool { return o.lk.Key() == e.lk.Key() })
		if j < 0 {
			continue // nobody was left waiting
		}
		next := b.all[i+1+j]
		checked++
		gap := next.granted.Sub(e.granted)
		if ok, why := probe.Within(gap, ttl+bound, 3, e.granted); !ok {
			t.Errorf("slot %s of a dead holder granted again only %v after its grant (TTL %v): %s", e.lk.Key(), gap, ttl, why)
		}
	}
	t.Logf("%d dead holders, %d of them followed by a grant of their slot, checked (bound TTL + %v); the run took %v", deads, checked, bound, time.Since(began))
	assert.Greater(t, checked, deads/2, "dead holders whose slot was checked")

	// Every slot comes back: once the last dead permit's TTL has passed,
	// all N are granted to TryAcquire.
	last := b.all[len(b.all)-1].granted
	time.Sleep(time.Until(last.Add(ttl + 5*time.Millisecond)))
	var back []*redlease.Lock
	probe.WaitFor(t, ttl, 3, 5*time.Millisecond, func() bool {
		lk, err := liveSem.TryAcquire(t.Context())
		if err == nil {
			back = append(back, lk)
		} else if !errors.Is(err, redlease.ErrNotObtained) {
			t.Logf("TryAcquire: %v", err)
		}
		return len(back) == n
	}, "every slot granted once the dead holders' TTLs passed")
	for _, lk := range back {
		require.NoError(t, lk.Release(t.Context()))
	}
}

// TestSemaphoreRejectsBadInput: an empty name, N below 1 or above
// MaxPermits, a nil Locker, a nil fn: ErrInvalid, and nothing taken.
func TestSemaphoreRejectsBadInput(t *testing.T) {
	f := newFake()
	l := newLocker(t, f)
	for _, c := range []struct {
		name string
		n    int
	}{{"", 3}, {"s", 0}, {"s", -1}, {"s", redlease.MaxPermits + 1}} {
		sem, err := l.Semaphore(c.name, c.n)
		assert.ErrorIs(t, err, redlease.ErrInvalid, "%q, %d", c.name, c.n)
		assert.Nil(t, sem)
	}
	_, err := (*redlease.Locker)(nil).Semaphore("s", 1)
	assert.ErrorIs(t, err, redlease.ErrInvalid, "nil Locker")
	_, err = (*redlease.Semaphore)(nil).TryAcquire(t.Context())
	assert.ErrorIs(t, err, redlease.ErrInvalid, "nil Semaphore")
	_, err = new(redlease.Semaphore).Acquire(t.Context())
	assert.ErrorIs(t, err, redlease.ErrInvalid, "zero Semaphore")
	assert.Zero(t, (*redlease.Semaphore)(nil).Permits())
	sem, err := l.Semaphore("s", redlease.MaxPermits)
	require.NoError(t, err)
	assert.Equal(t, "s#0", sem.Slots()[0])
	assert.Equal(t, fmt.Sprintf("s#%d", redlease.MaxPermits-1), sem.Slots()[redlease.MaxPermits-1])
	assert.ErrorIs(t, sem.Do(t.Context(), nil), redlease.ErrInvalid, "nil fn")
	_, err = sem.TryAcquire(t.Context(), redlease.WithTTL(-time.Second))
	assert.ErrorIs(t, err, redlease.ErrInvalid, "a bad option")
	assert.Empty(t, f.held, "nothing taken")
}

// TestSemaphoreOutageIsNotAllHeld: a round in which one slot was refused
// and another undecided is ErrUnavailable, never ErrNotObtained; one in
// which every slot was refused is ErrNotObtained, with each slot's error.
func TestSemaphoreOutageIsNotAllHeld(t *testing.T) {
	f := newFake()
	l := newLocker(t, f)
	sem, err := l.Semaphore("s", 2)
	require.NoError(t, err)
	a, err := sem.TryAcquire(t.Context())
	require.NoError(t, err)
	b, err := sem.TryAcquire(t.Context())
	require.NoError(t, err)
	assert.NotEqual(t, a.Key(), b.Key(), "two permits, two slots")
	f.mu.Lock()
	f.failNext = []error{redlease.ErrUnavailable}
	f.mu.Unlock()
	_, err = sem.TryAcquire(t.Context())
	require.ErrorIs(t, err, redlease.ErrUnavailable)
	require.NotErrorIs(t, err, redlease.ErrNotObtained, "an undecided slot is no holder: %v", err)
	_, err = sem.TryAcquire(t.Context())
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	require.NotErrorIs(t, err, redlease.ErrUnavailable)
	var pe *redlease.PermitError
	require.ErrorAs(t, err, &pe)
	assert.Len(t, pe.Slots, 2)
	for i, e := range pe.Slots {
		assert.ErrorIs(t, e, redlease.ErrNotObtained, "slot %d", i)
	}
	assert.Contains(t, err.Error(), `semaphore "s": 2 of 2 slots held`)
}

// TestSemaphoreAcquireReturnsByItsDeadline: every slot held, Acquire
// waits until its ctx's deadline and returns ErrNotObtained with it.
func TestSemaphoreAcquireReturnsByItsDeadline(t *testing.T) {
	f := newFake()
	l := newLocker(t, f, redlease.WithRetryDelay(time.Millisecond, 5*time.Millisecond))
	sem, err := l.Semaphore("s", 2)
	require.NoError(t, err)
	for range 2 {
		_, err := sem.TryAcquire(t.Context())
		require.NoError(t, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err = sem.Acquire(ctx)
	require.ErrorIs(t, err, redlease.ErrNotObtained)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
