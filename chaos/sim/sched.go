package sim

import (
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
	mu  sync.Mutex
	q   eventQueue
	seq uint64
	// timer wakes the loop when the earliest event is due. While the
	// loop sleeps (sleeping), armed is when timer fires (zero: not
	// armed, the queue was empty), and at re-arms it for an earlier
	// event itself: the loop is woken only when an event is due, not
	// once more by every push (half of its wake-ups, each a goroutine
	// switch and a select, on watchdog-mixed).
	//
	// An event due at once is not left to the timer: a bubble runs its
	// timers only once every goroutine in it is durably blocked, and a
	// goroutine waiting on a mutex is not (the Wake scenarios' HELLO,
	// due at once, is read holding go-redis PubSub's mutex while the hub's
	// other goroutine waits for it: see the package doc), so such an
	// event wakes the loop by wake, as every push did before.
	timer    *time.Timer
	sleeping bool
	armed    time.Time
	wake     chan struct{} // cap 1: an event due at once was pushed
	stop     chan struct{}
	done     chan struct{}
	// post runs after every event, on the loop (the state check: see
	// World.flushState); nil: nothing.
	post func()
	// turn orders the go-redis commands started at one instant (orderHook).
	turn *turnstile
}

type event struct {
	at  time.Time
	seq uint64
	f   func()
}

// eventQueue is a binary min-heap of events by (at, seq), typed (no
// container/heap: its Push and Pop box every event in an interface, two
// allocations per message). Keys are unique, so the order events leave
// in is the keys' order whatever the heap's shape.
type eventQueue []event

func (q eventQueue) less(i, j int) bool {
	if !q[i].at.Equal(q[j].at) {
		return q[i].at.Before(q[j].at)
	}
	return q[i].seq < q[j].seq
}

// push adds e.
func (q *eventQueue) push(e event) {
	*q = append(*q, e)
	h := *q
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

// pop removes and returns the earliest event; q must not be empty.
func (q *eventQueue) pop() event {
	h := *q
	e := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h[n] = event{}
	h = h[:n]
	for i := 0; ; {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*q = h
	return e
}

// newSched starts a run's network; post, if given, runs after every event.
func newSched(post ...func()) *sched {
	s := &sched{wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	if len(post) > 0 {
		s.post = post[0]
	}
	s.timer = time.NewTimer(time.Hour)
	s.timer.Stop()
	s.turn = newTurnstile()
	go s.loop()
	return s
}

// at runs f at virtual time t (at once if t has passed) on the loop.
func (s *sched) at(t time.Time, f func()) {
	s.mu.Lock()
	s.seq++
	s.q.push(event{t, s.seq, f})
	if s.sleeping {
		switch {
		case !t.After(time.Now()):
			select {
			case s.wake <- struct{}{}:
			default:
			}
		case s.armed.IsZero() || t.Before(s.armed):
			s.armLocked(t)
		}
	}
	s.mu.Unlock()
}

// armLocked sets the loop's timer to fire at t. Call with s.mu held.
func (s *sched) armLocked(t time.Time) {
	s.armed = t
	s.timer.Reset(time.Until(t))
}

// loop runs due events until close. Events still queued then are
// dropped (the run is over).
func (s *sched) loop() {
	defer close(s.done)
	defer s.timer.Stop()
	for {
		s.mu.Lock()
		s.sleeping = false
		now := time.Now()
		var f func()
		if len(s.q) > 0 && !s.q[0].at.After(now) {
			f = s.q.pop().f
		}
		if f != nil {
			s.mu.Unlock()
			f()
			if s.post != nil {
				s.post()
			}
			continue
		}
		// Sleep until the earliest event is due; at re-arms the timer
		// for an earlier one pushed meanwhile. The timer is set under
		// s.mu, so a push never finds it armed later than its event.
		s.sleeping = true
		if len(s.q) > 0 {
			s.armLocked(s.q[0].at)
		} else {
			s.armed = time.Time{}
			s.timer.Stop()
		}
		s.mu.Unlock()
		select {
		case <-s.stop:
			return
		case <-s.wake:
		case <-s.timer.C:
		}
	}
}

// close stops the turnstile and the loop and waits for them.
func (s *sched) close() {
	s.turn.close()
	close(s.stop)
	<-s.done
}
