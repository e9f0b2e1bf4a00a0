package wake

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

// An undo's notice (UndoNotice) reaches a waiter after a jittered pause
// that doubles with each undo notice since the last release notice, up to
// undoMax; a release notice arrives at once and starts the pauses over;
// notices coalesce while one is on its way; a removed waiter hears
// nothing more. Virtual time: the hub is driven by hand (handleLocked), no
// connection.
func TestUndoNoticesArePaced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ch = "redlease:wake:{k}"
		sub := &Sub{set: &Set{subs: map[*Sub]struct{}{}}, notify: make(chan struct{}, 1), progress: make(chan struct{}, 1)}
		h := &hub{chans: map[string]*entry{ch: {channel: ch, subs: map[*Sub]struct{}{sub: {}}}}}
		deliver := func(payload string) {
			mu.Lock()
			h.handleLocked(&redis.Message{Channel: ch, Payload: payload})
			mu.Unlock()
		}
		// waitNotice returns how long the next notice took (virtual).
		waitNotice := func() time.Duration {
			start := time.Now()
			select {
			case <-sub.notify:
			case <-time.After(10 * time.Second):
				t.Fatal("no notice within 10 s")
			}
			return time.Since(start)
		}

		deliver("")
		if d := waitNotice(); d != 0 {
			t.Fatalf("a release notice took %v, want at once", d)
		}
		// Undo notices in a row: each pause within [d/2, d] of a doubling d.
		want := undoBase
		for i := range 10 {
			deliver(UndoNotice)
			deliver(UndoNotice) // coalesced with the one on its way
			d := waitNotice()
			if d < want/2 || d > want {
				t.Fatalf("undo notice %d after %v, want within [%v, %v]", i+1, d, want/2, want)
			}
			want = min(2*want, undoMax)
		}
		select {
		case <-sub.notify:
			t.Fatal("two undo notices while one was on its way gave two notices")
		case <-time.After(2 * undoMax):
		}
		// A release notice: at once, and the pauses start over.
		deliver(UndoNotice)
		deliver("head-id")
		if d := waitNotice(); d != 0 {
			t.Fatalf("a release notice during an undo's pause took %v, want at once", d)
		}
		select {
		case <-sub.notify:
			t.Fatal("the undo notice cancelled by the release still came")
		case <-time.After(2 * undoMax):
		}
		deliver(UndoNotice)
		if d := waitNotice(); d > undoBase {
			t.Fatalf("first undo notice after a release took %v, want at most %v", d, undoBase)
		}
		// Removed: an undo on its way is not delivered.
		deliver(UndoNotice)
		mu.Lock()
		sub.removeLocked(false)
		mu.Unlock()
		select {
		case <-sub.notify:
			t.Fatal("a removed waiter heard an undo")
		case <-time.After(2 * undoMax):
		}
	})
}
