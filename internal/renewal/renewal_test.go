package renewal_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"

	"github.com/redlease/redlease/internal/renewal"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errNotHeld = errors.New("not held")

// item is a kept thing with a TTL, valid until a tenth of it before Until.
type item struct {
	mu    sync.Mutex
	ttl   time.Duration
	until time.Time
}

func newItem(ttl time.Duration) *item { return &item{ttl: ttl, until: time.Now().Add(ttl)} }

func (i *item) TTL() time.Duration { return i.ttl }
func (i *item) Until() time.Time {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.until
}
func (i *item) Deadline() time.Time { return i.Until().Add(-i.ttl / 10) }
func (i *item) Valid() bool         { return time.Now().Before(i.Deadline()) }

// extender extends items, counting calls; while block is non-nil a call
// waits for it to close (like a client that ignores its context).
type extender struct {
	mu    sync.Mutex
	calls int
	block chan struct{}
}

func (x *extender) extend(ctx context.Context, items []*item) []error {
	x.mu.Lock()
	x.calls++
	block := x.block
	x.mu.Unlock()
	if block != nil {
		<-block
	}
	errs := make([]error, len(items))
	for _, it := range items {
		it.mu.Lock()
		it.until = time.Now().Add(it.ttl)
		it.mu.Unlock()
	}
	return errs
}

func (x *extender) count() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.calls
}

func newEngine(x *extender, idle bool) *renewal.Engine[*item] {
	return renewal.New(renewal.Config[*item]{
		Extend:   x.extend,
		NotHeld:  func(err error) bool { return errors.Is(err, errNotHeld) },
		Lane:     func(*item) any { return "one" },
		IdleStop: idle,
	})
}

// An IdleStop engine runs no goroutine before the first Keep, extends what
// it keeps, ends its goroutines when it keeps nothing, and starts again on
// the next Keep. synctest.Test itself fails if a goroutine is left over.
func TestIdleStopEndsAndRestarts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := &extender{}
		e := newEngine(x, true)
		if e.Running() {
			t.Fatal("running before the first Keep")
		}
		for round := range 3 {
			it := newItem(3 * time.Second)
			first := it.Until()
			stop := e.Keep(it)
			if !e.Running() {
				t.Fatalf("round %d: not running after Keep", round)
			}
			time.Sleep(5 * time.Second)
			if got := it.Until(); !got.After(first.Add(time.Second)) || !it.Valid() {
				t.Fatalf("round %d: not extended: until %v, first %v", round, got, first)
			}
			stop()
			synctest.Wait()
			if e.Running() || e.Len() != 0 {
				t.Fatalf("round %d: running %v with %d kept after the last stop", round, e.Running(), e.Len())
			}
		}
		e.Close()
		if stop := e.Keep(newItem(time.Second)); e.Running() || e.Len() != 0 {
			t.Fatal("Keep after Close started the engine")
		} else {
			stop()
		}
	})
}

// An item dropped while its call is in flight leaves the engine running
// until the call returns; then it goes idle.
func TestIdleStopWaitsForCallInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		block := make(chan struct{})
		x := &extender{block: block}
		e := newEngine(x, true)
		stop := e.Keep(newItem(3 * time.Second))
		time.Sleep(time.Second) // due at 1 s, taken at 0.75 s
		synctest.Wait()
		if x.count() != 1 {
			t.Fatalf("calls = %d, want 1 in flight", x.count())
		}
		stop()
		synctest.Wait()
		if !e.Running() {
			t.Fatal("idle while a call is in flight")
		}
		close(block)
		synctest.Wait()
		if e.Running() {
			t.Fatal("still running after the call returned")
		}
	})
}

// Without IdleStop the scheduler runs from New to Stop, kept items or not.
func TestWithoutIdleStopRunsUntilStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		e := newEngine(&extender{}, false)
		if !e.Running() {
			t.Fatal("not running after New")
		}
		e.Keep(newItem(time.Second))()
		synctest.Wait()
		if !e.Running() {
			t.Fatal("stopped when idle without IdleStop")
		}
		e.Close()
		if e.Running() {
			t.Fatal("running after Close")
		}
		e.Close()
	})
}

// bounded is a lane key with a call bound of its own, like the quorum
// strategy with its node timeout.
type bounded struct{ d time.Duration }

func (b *bounded) CallBound() time.Duration { return b.d }

// slowExtender takes its time for every call, counting how many overlap.
type slowExtender struct {
	mu            sync.Mutex
	took          time.Duration
	inFlight, max int
	calls         int
}

func (x *slowExtender) extend(ctx context.Context, items []*item) []error {
	x.mu.Lock()
	x.calls++
	x.inFlight++
	x.max = max(x.max, x.inFlight)
	x.mu.Unlock()
	time.Sleep(x.took) // a call the strategy may take: within its bound
	x.mu.Lock()
	x.inFlight--
	x.mu.Unlock()
	for _, it := range items {
		it.mu.Lock()
		it.until = time.Now().Add(it.ttl)
		it.mu.Unlock()
	}
	return make([]error, len(items))
}

// A strategy whose calls may take up to 1 s (its CallBound) gets twice
// that before the engine gives up on a renewal, although the engine's own
// renewal timeout is 1 s: a 1.5 s renewal is waited for, not abandoned and
// retried beside itself.
func TestLaneWaitsForItsStrategysCallBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := &slowExtender{took: 1500 * time.Millisecond}
		key := &bounded{d: time.Second}
		w := renewal.New(renewal.Config[*item]{
			Timeout:  time.Second,
			Extend:   x.extend,
			NotHeld:  func(err error) bool { return errors.Is(err, errNotHeld) },
			Lane:     func(*item) any { return key },
			IdleStop: true,
		})
		it := newItem(6 * time.Second)
		stop := w.Keep(it)
		time.Sleep(10 * time.Second)
		assert.True(t, it.Valid(), "kept")
		x.mu.Lock()
		calls, most := x.calls, x.max
		x.mu.Unlock()
		assert.Equal(t, 1, most, "no renewal abandoned and retried beside itself (%d calls)", calls)
		stop()
		time.Sleep(2 * time.Second) // a call in flight returns; the idle engine then ends
		synctest.Wait()
	})
}

// shardedItem is an item that names its shard (renewal.Sharded).
type shardedItem struct {
	*item
	shard string
}

func (i shardedItem) Shard() string { return i.shard }

// boundedStrategy is a lane key with a call bound of its own.
type boundedStrategy struct{ bound time.Duration }

func (b *boundedStrategy) CallBound() time.Duration { return b.bound }

// Items of one strategy on different shards go in different lanes (calls
// of their own); on one shard, or naming none, in the same lane; the
// strategy's call bound still applies to each shard's lane.
func TestLaneKeyPerShard(t *testing.T) {
	s := &boundedStrategy{bound: 3 * time.Second}
	a := renewal.LaneKey(s, shardedItem{newItem(time.Second), "10.0.0.1:7000"})
	a2 := renewal.LaneKey(s, shardedItem{newItem(time.Second), "10.0.0.1:7000"})
	b := renewal.LaneKey(s, shardedItem{newItem(time.Second), "10.0.0.2:7000"})
	none := renewal.LaneKey(s, shardedItem{newItem(time.Second), ""})
	assert.Equal(t, a, a2, "one shard, one lane")
	assert.NotEqual(t, a, b, "two shards, two lanes")
	assert.Equal(t, any(s), none, "no shard: the strategy's lane")
	cb, ok := a.(renewal.CallBounder)
	if assert.True(t, ok, "a shard's lane keeps the strategy's call bound") {
		assert.Equal(t, 3*time.Second, cb.CallBound())
	}
}
