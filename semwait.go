package redlease

import (
	"context"
	"reflect"
	"sync"
	"time"
)

// MaxWatchedPermits is the most permits a Semaphore's Acquire subscribes
// to the releases of (one subscription per slot): a semaphore with more
// polls its slots with backoff alone.
const MaxWatchedPermits = 64

// semWaiting is a Semaphore Acquire's wait between rounds: its timer and,
// on a Waker, its subscriptions to every slot's releases. It is waiting
// (see Waker's contract) once per slot: a notice a round did not answer
// (the round was granted another slot before it tried this one, or gave
// up) goes on to the process's next waiter of that slot.
type semWaiting struct {
	timer   *time.Timer
	notices []<-chan struct{} // slot i's; nil: not subscribed
	stops   []func(handOn bool)
	owed    []bool // slot i's notice taken, and no round the nodes decided has tried slot i since
	tried   bool   // subscriptions were tried
	cases   []reflect.SelectCase
}

// subscribed reports whether releases of the slots wake this call.
func (w *semWaiting) subscribed() bool { return w.notices != nil }

// watch subscribes to every slot's releases (keys, as sent to Redis),
// confirmed, after the first round the nodes refused, once per call, and
// reports whether it did: the caller then tries a round again at once,
// since a release between the first round and the subscriptions was not
// heard. It subscribes to nothing if the strategy is no Waker, the call
// polls, the slots are more than MaxWatchedPermits, or any subscription
// failed (those made are ended).
func (w *semWaiting) watch(ctx context.Context, c lockConfig, keys []string) bool {
	if w.tried || c.polling || len(keys) > MaxWatchedPermits {
		return false
	}
	w.tried = true
	wk, ok := c.strategy.(Waker)
	if !ok {
		return false
	}
	notices := make([]<-chan struct{}, len(keys))
	stops := make([]func(bool), len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() { notices[i], stops[i], errs[i] = wk.Watch(ctx, key, "") })
	}
	wg.Wait()
	failed := false
	for _, err := range errs {
		failed = failed || err != nil
	}
	if failed {
		for i, stop := range stops {
			if errs[i] == nil && stop != nil {
				stop(false)
			}
		}
		return false
	}
	w.notices, w.stops, w.owed = notices, stops, make([]bool, len(keys))
	return true
}

// takeNotices takes the notices that came before the round about to be
// sent: that round answers them (for each slot it tries).
func (w *semWaiting) takeNotices() {
	for i, ch := range w.notices {
		select {
		case <-ch:
			w.owed[i] = true
		default:
		}
	}
}

// answered records that a round tried slot i and the nodes decided it
// (granted or refused): the notices of slot i this call took are
// answered.
func (w *semWaiting) answered(i int) {
	if w.owed != nil {
		w.owed[i] = false
	}
}

// sleep waits d, or until a notice of any slot comes (which this call
// then owes), and reports false if ctx ended first.
func (w *semWaiting) sleep(ctx context.Context, d time.Duration) bool {
	if w.timer == nil {
		w.timer = time.NewTimer(d)
	} else {
		w.timer.Reset(d)
	}
	if w.notices == nil {
		select {
		case <-ctx.Done():
			return false
		case <-w.timer.C:
			return true
		}
	}
	if w.cases == nil {
		w.cases = make([]reflect.SelectCase, 2+len(w.notices))
		for i, ch := range w.notices {
			w.cases[2+i] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ch)}
		}
	}
	w.cases[0] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())}
	w.cases[1] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.timer.C)}
	chosen, _, _ := reflect.Select(w.cases)
	switch chosen {
	case 0:
		return false
	case 1:
	default:
		w.owed[chosen-2] = true
	}
	return true
}

// end stops the timer and ends every subscription. A slot's notice this
// call owes, or one still waiting in its channel, goes on to the next
// waiter of that slot (handOn), unless the call was granted that very
// slot (granted: its index, -1 if none): nobody else can take it before
// this call's release, which wakes the next waiter. Unlike a Lock's
// wait, a granted call hands on the notices of the other slots: a slot
// released while this call took another is free for someone else.
func (w *semWaiting) end(granted int) {
	if w.timer != nil {
		w.timer.Stop()
	}
	for i, stop := range w.stops {
		if i == granted {
			select {
			case <-w.notices[i]:
			default:
			}
			stop(false)
			continue
		}
		stop(w.owed[i] || len(w.notices[i]) > 0)
	}
}
