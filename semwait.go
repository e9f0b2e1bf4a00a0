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
// on a Waker, one Lock wait (waiting) per slot, subscribed to that slot's
// releases. Each slot keeps Lock's rules for the notices it takes (see
// waiting and Waker): a notice a round did not answer (the round was
// granted another slot before it tried this one, or gave up) goes on to
// the process's next waiter of that slot.
type semWaiting struct {
	timer *time.Timer
	slots []waiting // nil: not subscribed
	tried bool      // subscriptions were tried
	cases []reflect.SelectCase
}

// subscribed reports whether releases of the slots wake this call.
func (w *semWaiting) subscribed() bool { return w.slots != nil }

// watch subscribes to every slot's releases (slots, as given, under the
// Locker's prefix), confirmed, after the first round the nodes refused,
// once per call, and reports whether it did: the caller then tries a
// round again at once, since a release between the first round and the
// subscriptions was not heard. It subscribes to nothing if the strategy
// is no Waker, the call polls, the slots are more than
// MaxWatchedPermits, or any subscription failed (those made are ended).
func (w *semWaiting) watch(ctx context.Context, c lockConfig, prefix string, slots []string) bool {
	if w.tried || c.polling || len(slots) > MaxWatchedPermits {
		return false
	}
	w.tried = true
	wk, ok := c.strategy.(Waker)
	if !ok {
		return false
	}
	ws := make([]waiting, len(slots))
	errs := make([]error, len(slots))
	var wg sync.WaitGroup
	for i, slot := range slots {
		wg.Go(func() { ws[i].notices, ws[i].stopWatch, errs[i] = wk.Watch(ctx, prefix+slot, "") })
	}
	wg.Wait()
	failed := false
	for _, err := range errs {
		failed = failed || err != nil
	}
	if failed {
		for i := range ws {
			if errs[i] == nil {
				ws[i].stopWatch(false)
			}
		}
		return false
	}
	w.slots = ws
	return true
}

// takeNotices takes the notices that came before the round about to be
// sent: that round answers them (for each slot it tries).
func (w *semWaiting) takeNotices() {
	for i := range w.slots {
		w.slots[i].takeNotice()
	}
}

// answered records that a round tried slot i and the nodes decided it
// (granted or refused): the notices of slot i this call took are
// answered.
func (w *semWaiting) answered(i int) {
	if w.slots != nil {
		w.slots[i].answered()
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
	if w.slots == nil {
		select {
		case <-ctx.Done():
			return false
		case <-w.timer.C:
			return true
		}
	}
	if w.cases == nil {
		w.cases = make([]reflect.SelectCase, 2+len(w.slots))
		for i := range w.slots {
			w.cases[2+i] = reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.slots[i].notices)}
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
		w.slots[chosen-2].owed = true
	}
	return true
}

// end stops the timer and ends every subscription, each slot as a Lock
// wait ends (waiting.end): the slot the call was granted (granted: its
// index, -1 if none) as a granted wait, which drops a notice still
// waiting (nobody else can take the slot before this call's release,
// which wakes the next waiter); every other slot as a wait that gave up,
// which hands on a notice it owes or that still waits: unlike a Lock's
// wait, a granted call hands on the other slots' notices, since a slot
// released while this call took another is free for someone else.
func (w *semWaiting) end(granted int) {
	if w.timer != nil {
		w.timer.Stop()
	}
	for i := range w.slots {
		w.slots[i].end(i != granted)
	}
}
