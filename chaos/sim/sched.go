package sim

import (
	"container/heap"
	"sync"
	"time"
)

// sched is the run's network: one goroutine that delivers every message
// at its virtual time, in (time, send order) order, and runs the nodes'
// commands. The first version gave each delivery its own time.AfterFunc
// goroutine; each started on a small stack and grew it through
// miniredis and gopher-lua (stack copying was 17 % of a run's CPU), and
// deliveries due at one instant ran in whatever order the Go scheduler
// picked. One long-lived goroutine keeps its grown stack and orders ties
// by send order.
type sched struct {
	mu   sync.Mutex
	q    eventQueue
	seq  uint64
	wake chan struct{} // cap 1: an event was pushed
	stop chan struct{}
	done chan struct{}
	// post runs after every event, on the loop (the state check: see
	// World.flushState); nil: nothing.
	post func()
}

type event struct {
	at  time.Time
	seq uint64
	f   func()
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	old[len(old)-1] = event{}
	*q = old[:len(old)-1]
	return e
}

// newSched starts a run's network; post, if given, runs after every event.
func newSched(post ...func()) *sched {
	s := &sched{wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if len(post) > 0 {
		s.post = post[0]
	}
	go s.loop()
	return s
}

// at runs f at virtual time t (at once if t has passed) on the loop.
func (s *sched) at(t time.Time, f func()) {
	s.mu.Lock()
	s.seq++
	heap.Push(&s.q, event{t, s.seq, f})
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// loop runs due events until close. Events still queued then are
// dropped (the run is over).
func (s *sched) loop() {
	defer close(s.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		s.mu.Lock()
		now := time.Now()
		var f func()
		var next time.Time
		if len(s.q) > 0 {
			if !s.q[0].at.After(now) {
				f = heap.Pop(&s.q).(event).f
			} else {
				next = s.q[0].at
			}
		}
		s.mu.Unlock()
		if f != nil {
			f()
			if s.post != nil {
				s.post()
			}
			continue
		}
		var tc <-chan time.Time
		if !next.IsZero() {
			t.Reset(next.Sub(now))
			tc = t.C
		}
		select {
		case <-s.stop:
			return
		case <-s.wake:
		case <-tc:
		}
	}
}

// close stops the loop and waits for it.
func (s *sched) close() {
	close(s.stop)
	<-s.done
}
