package bounded_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease/internal/bounded"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// slowJob answers its own number after took (or its ctx's end), and
// records the outcome Late is given.
type slowJob struct {
	n    int64
	took time.Duration
	late chan lateOutcome // one per abandoned call
}

type lateOutcome struct {
	n, v int64
	err  error
}

func (j *slowJob) Do(ctx context.Context) (int64, error) {
	time.Sleep(j.took) // like a client that ignores ctx
	return j.n, nil
}

func (j *slowJob) Late(v int64, err error) { j.late <- lateOutcome{j.n, v, err} }

// A bound call whose ctx ends first returns Abandoned at once, with the
// ctx's cause; its Late runs once the job returns, with the job's outcome.
// One that returns in time answers its own outcome, and no Late runs.
func TestCellsAbandonAndHandOver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cells bounded.Cells[int64]
		late := make(chan lateOutcome, 1)
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := cells.Call(ctx, true, &slowJob{n: 7, took: time.Second, late: late})
		assert.Equal(t, 100*time.Millisecond, time.Since(start), "returned at the deadline")
		var ab bounded.Abandoned
		require.ErrorAs(t, err, &ab)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		synctest.Wait()
		assert.Empty(t, late, "Late before the job returned")
		time.Sleep(time.Second)
		synctest.Wait()
		require.Len(t, late, 1)
		assert.Equal(t, lateOutcome{7, 7, nil}, <-late)

		v, err := cells.Call(t.Context(), true, &slowJob{n: 8, took: 10 * time.Millisecond, late: late})
		require.NoError(t, err)
		assert.Equal(t, int64(8), v)
		synctest.Wait()
		assert.Empty(t, late, "Late of a call that was not abandoned")
	})
}

// Cells reused across many concurrent calls, some abandoned and some not,
// never mix their outcomes: every call that returned answers its own job's
// number, and every abandoned one hands its own number to its Late.
func TestCellsKeepCallsApart(t *testing.T) {
	var cells bounded.Cells[int64]
	const calls = 2000
	late := make(chan lateOutcome, calls)
	var answered, abandoned atomic.Int64
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), time.Duration(i%5)*50*time.Microsecond)
			defer cancel()
			j := &slowJob{n: int64(i), took: time.Duration(i%7) * 30 * time.Microsecond, late: late}
			v, err := cells.Call(ctx, true, j)
			var ab bounded.Abandoned
			switch {
			case errors.As(err, &ab):
				abandoned.Add(1)
			case err != nil:
				t.Errorf("call %d: %v", i, err)
			default:
				answered.Add(1)
				if v != int64(i) {
					t.Errorf("call %d answered %d", i, v)
				}
			}
		})
	}
	wg.Wait()
	for range abandoned.Load() {
		o := <-late
		assert.Equal(t, o.n, o.v, "an abandoned call's Late got another call's outcome")
	}
	assert.Empty(t, late, "a Late for a call that answered")
	t.Logf("examined %d answered and %d abandoned calls", answered.Load(), abandoned.Load())
	require.Positive(t, answered.Load())
	require.Positive(t, abandoned.Load())
}

// Unbound, or with a ctx that never ends, the job runs on the caller's
// goroutine: nothing abandons it.
func TestCellsUnbound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var cells bounded.Cells[int64]
		ctx, cancel := context.WithTimeout(t.Context(), time.Millisecond)
		defer cancel()
		v, err := cells.Call(ctx, false, &slowJob{n: 3, took: time.Second})
		require.NoError(t, err)
		assert.Equal(t, int64(3), v)
		v, err = cells.Call(context.Background(), true, &slowJob{n: 4, took: time.Second})
		require.NoError(t, err)
		assert.Equal(t, int64(4), v)
	})
}

type key struct{}

// Deadlines: a ctx with a deadline is left alone; a ctx without one gets
// a deadline within (d − d/64, d] of the call's start, which ends it
// (Done, Err, Cause), shared by calls within the grain, keeping the
// ctx's values; a ctx that can be cancelled keeps that too.
func TestDeadlines(t *testing.T) {
	const d = 640 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		ds := bounded.NewDeadlines(d)
		within := func(what string, ctx context.Context, start time.Time) {
			t.Helper()
			dl, ok := ctx.Deadline()
			require.True(t, ok, what)
			left := dl.Sub(start)
			assert.True(t, left <= d && left > d-d/64, "%s: deadline %v after the start", what, left)
		}

		withDeadline, cancel := context.WithTimeout(t.Context(), time.Hour)
		defer cancel()
		got, done := ds.Bound(withDeadline)
		done()
		assert.Equal(t, withDeadline, got, "a ctx with a deadline is bounded by it alone")

		start := time.Now()
		bg, done := ds.Bound(context.Background())
		done()
		within("Background", bg, start)
		time.Sleep(d / 128)
		bg2, done := ds.Bound(context.Background())
		done()
		within("Background, later", bg2, time.Now())
		assert.Equal(t, bg.Done(), bg2.Done(), "calls within the grain share one deadline")
		time.Sleep(d / 64)
		bg3, done := ds.Bound(context.Background())
		done()
		within("Background, past the grain", bg3, time.Now())
		assert.NotEqual(t, bg.Done(), bg3.Done(), "a call past the grain gets a deadline of its own")

		valued := context.WithValue(context.Background(), key{}, "v")
		vctx, done := ds.Bound(valued)
		done()
		within("values", vctx, time.Now())
		assert.Equal(t, "v", vctx.Value(key{}))
		derived, cancelDerived := context.WithCancel(vctx)
		defer cancelDerived()
		without, done := ds.Bound(context.WithoutCancel(valued))
		done()
		within("WithoutCancel", without, time.Now())
		assert.Equal(t, "v", without.Value(key{}))

		parent, cancelParent := context.WithCancel(valued)
		cctx, cancelC := ds.Bound(parent)
		defer cancelC()
		within("cancellable", cctx, time.Now())
		assert.Equal(t, "v", cctx.Value(key{}))
		cancelParent()
		<-cctx.Done()
		assert.ErrorIs(t, cctx.Err(), context.Canceled, "cancelling the ctx ends its bound ctx")

		for _, e := range []struct {
			name string
			c    context.Context
		}{{"Background", bg}, {"values", vctx}, {"derived from values", derived}, {"WithoutCancel", without}} {
			dl, _ := e.c.Deadline()
			if time.Now().Before(dl) {
				select {
				case <-e.c.Done():
					t.Errorf("%s: ended before its deadline", e.name)
				default:
				}
			}
			time.Sleep(time.Until(dl))
			<-e.c.Done()
			assert.Equal(t, dl, time.Now(), "%s ends at its deadline", e.name)
			assert.ErrorIs(t, e.c.Err(), context.DeadlineExceeded, e.name)
			assert.ErrorIs(t, context.Cause(e.c), context.DeadlineExceeded, e.name)
		}
	})
}

// A bound call from a ctx without a deadline (the shared deadline of
// Deadlines) is abandoned at that deadline, whoever shares it.
func TestDeadlinesBoundCalls(t *testing.T) {
	const d = time.Second
	synctest.Test(t, func(t *testing.T) {
		ds := bounded.NewDeadlines(d)
		var cells bounded.Cells[int64]
		late := make(chan lateOutcome, 8)
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Go(func() {
				ctx, done := ds.Bound(context.WithValue(context.Background(), key{}, i))
				defer done()
				start := time.Now()
				_, err := cells.Call(ctx, true, &slowJob{n: int64(i), took: time.Hour, late: late})
				assert.ErrorIs(t, err, context.DeadlineExceeded, fmt.Sprint(i))
				assert.LessOrEqual(t, time.Since(start), d)
			})
			time.Sleep(d / 100)
		}
		wg.Wait()
		time.Sleep(time.Hour)
		synctest.Wait()
		assert.Len(t, late, 8)
	})
}

// endingCtx is a ctx whose end the test orders by hand: end makes Err
// (and Cause) report DeadlineExceeded before Done is closed, as a ctx
// that ends while both the job and the caller wait on it is seen by the
// one the scheduler runs first.
type endingCtx struct {
	context.Context
	done  chan struct{}
	ended atomic.Bool
}

func newEndingCtx() *endingCtx {
	return &endingCtx{Context: context.Background(), done: make(chan struct{})}
}

func (c *endingCtx) Done() <-chan struct{} { return c.done }

func (c *endingCtx) Err() error {
	if c.ended.Load() {
		return context.DeadlineExceeded
	}
	return nil
}

// endsCtxJob ends its ctx (Err only) and returns the ctx's error, as a
// job does whose wait on the same ctx saw its end before the caller did.
type endsCtxJob struct {
	ctx  *endingCtx
	late chan lateOutcome
}

func (j *endsCtxJob) Do(ctx context.Context) (int64, error) {
	j.ctx.ended.Store(true)
	return 5, ctx.Err()
}

func (j *endsCtxJob) Late(v int64, err error) { j.late <- lateOutcome{0, v, err} }

// A call whose job gave up because its ctx ended is abandoned, whichever
// of the two saw the end first: the caller gets Abandoned and the job's
// Late runs with its outcome, as when the caller's wait saw the end
// first. Forced order: the job returns, ctx's error, before Done is
// closed, so the caller's wait takes the job's outcome. Before, the
// caller returned that plain error and Late never ran: which of the two
// outcomes a call at its deadline reported followed the scheduler
// (cluster-failover 19, 26 and 67 in chaos/sim, replayed).
func TestCellsAJobEndedByItsCtxIsAbandoned(t *testing.T) {
	for _, name := range []string{"Cells", "Call"} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := newEndingCtx()
				late := make(chan lateOutcome, 1)
				j := &endsCtxJob{ctx: ctx, late: late}
				var err error
				if name == "Cells" {
					var cells bounded.Cells[int64]
					_, err = cells.Call(ctx, true, j)
				} else {
					_, err = bounded.Call(ctx, true, j.Do, j.Late)
				}
				close(ctx.done)
				var ab bounded.Abandoned
				require.ErrorAs(t, err, &ab)
				assert.ErrorIs(t, err, context.DeadlineExceeded)
				synctest.Wait()
				require.Len(t, late, 1, "the abandoned call's Late ran")
				assert.Equal(t, lateOutcome{0, 5, context.DeadlineExceeded}, <-late)
			})
		})
	}
}
