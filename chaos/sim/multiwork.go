package sim

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/redlease/redlease"
)

// The Multi workload (multiClient): transfers between accounts, each
// under a set of two account keys taken at once with Locker.TryLockAll,
// LockAll or DoAll, the two keys given in the transfer's direction (so
// that two transfers in opposite directions give them in opposite
// orders). Every lock of a set is a Hold of its key, so overlap,
// fence-order, stale-accepted, release-kept-valid and state-valid examine
// each key of a set as they examine a single lock; the set's own
// invariants are these:

// InvSetWhole: a set that TryLockAll, LockAll or DoAll returned (DoAll:
// handed to fn) had every one of its locks valid then: a key taken first
// and lost while a later one was waited for is never handed out as held.
const InvSetWhole = "set-whole"

// InvSetWait: in a scenario without faults, a LockAll or DoAll of two
// keys, with a deadline longer than every other client's holds put
// together, failed: the sets waited for each other (a deadlock), or a
// set's keys were left held after it failed.
const InvSetWait = "set-wait"

// setWait is the deadline of a LockAll or DoAll in a scenario without
// faults (InvSetWait): above every client's holds put together (Ops
// holds of at most 3 steps of 0.7 TTL each, plus their releases).
const setWait = 10 * time.Second

func init() {
	examinedIn[InvSetWhole] = func(sc *Scenario) bool { return sc.Multi }
	examinedIn[InvSetWait] = func(sc *Scenario) bool { return sc.Multi && !sc.Faults }
}

// multiClient is one Multi client (see above).
func (w *World) multiClient(ci int, locker *redlease.Locker, r *rand.Rand) {
	for seq := range w.sc.Ops {
		from := r.IntN(w.sc.Keys)
		to := (from + 1 + r.IntN(w.sc.Keys-1)) % w.sc.Keys
		keys := []string{fmt.Sprintf("k%d", from), fmt.Sprintf("k%d", to)}
		name := strings.Join(keys, "+")
		ttl := w.drawTTL(r)
		cd := ms(r, 20, 400)
		if !w.sc.Faults {
			cd = setWait
		}
		ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), ci, jitMulti, seq), cd)
		start := w.hist.now()
		var err error
		via := [...]string{"trylockall", "lockall", "doall"}[r.IntN(3)]
		opts := []redlease.LockOption{redlease.WithTTL(ttl)}
		switch via {
		case "trylockall":
			var set *redlease.LockSet
			set, err = locker.TryLockAll(ctx, keys, opts...)
			w.checkCtx(ci, via, name, start, cd, true)
			if err == nil {
				w.holdSet(ci, seq, via, ttl, set, r, true)()
			}
		case "lockall":
			var set *redlease.LockSet
			// With the Locker's own backoff until ctx's deadline: a wait
			// for the second key can outlast the first key's TTL (the
			// keeper must keep it, and a key lost meanwhile must not be
			// handed out).
			set, err = locker.LockAll(ctx, keys, opts...)
			w.checkCtx(ci, via, name, start, cd, true)
			if err == nil {
				w.holdSet(ci, seq, via, ttl, set, r, true)()
			}
		case "doall":
			var finish func()
			err = locker.DoAll(ctx, keys, func(_ context.Context, set *redlease.LockSet) error {
				finish = w.holdSet(ci, seq, via, ttl, set, r, false)
				return nil
			}, opts...)
			if finish != nil {
				finish()
			}
		}
		cancel()
		if via != "trylockall" && !w.sc.Faults {
			w.hist.ex.count(InvSetWait, 1)
			if err != nil {
				w.hist.violation(Violation{Inv: InvSetWait, At: w.hist.now(), Detail: fmt.Sprintf(
					"c%d#%d %s %s called at %.3fms with %v, no fault drawn: %v", ci, seq, via, name, msf(start), cd, short(err))})
			}
		}
		if err != nil {
			w.hist.failed()
			w.hist.logf("c%d#%d %s %s ttl=%v: %v", ci, seq, via, name, ttl, short(err))
			sleep(ms(r, 0, 30))
			continue
		}
		sleep(ms(r, 0, 20))
	}
}

// holdSet runs a set's hold (holdLocks), after checking that the set was
// handed out valid as a whole (set-whole); release: the set's release
// ends it.
func (w *World) holdSet(ci, seq int, via string, ttl time.Duration, set *redlease.LockSet, r *rand.Rand, release bool) (finish func()) {
	w.hist.ex.count(InvSetWhole, 1)
	if !set.Valid() {
		w.hist.violation(Violation{Inv: InvSetWhole, At: w.hist.now(), Detail: fmt.Sprintf(
			"c%d#%d %s %v handed out a set not valid as a whole: %v", ci, seq, via, set.Keys(), short(set.Err()))})
	}
	var rel func(context.Context) error
	if release {
		rel = set.Release
	}
	return w.holdLocks(ci, seq, via, ttl, set.Locks(), set.Valid, rel, r)
}

// holdLocks runs the hold of locks held together (a set's, or one
// permit): a Hold per lock, writes to each key's fenced register while
// valid says so, and (release not nil) the release. It returns what
// ends the hold: waiting for every lock's Lost, and recording the Holds
// (a release by DoAll or Do comes after fn returned, so its caller runs
// it after that call).
func (w *World) holdLocks(ci, seq int, via string, ttl time.Duration, locks []*redlease.Lock, valid func() bool, release func(context.Context) error, r *rand.Rand) (finish func()) {
	keys := make([]string, len(locks))
	for i, lk := range locks {
		keys[i] = lk.Key()
	}
	holds := make([]*Hold, len(locks))
	lives := make([]*liveLock, len(locks))
	done := make(chan int, len(locks))
	for i, lk := range locks {
		hd := &Hold{Client: ci, Seq: seq, Key: lk.Key(), Via: via, Fence: lk.Fence(), From: w.hist.now(), LostAt: -1, RelSent: -1, Token: lk.Token()}
		w.hist.logf("c%d#%d %s %s ttl=%v granted fence=%d until=+%.3fms", ci, seq, via, lk.Key(), ttl, lk.Fence(), msf(time.Until(lk.Until())))
		holds[i] = hd
		lost := lk.Lost()
		go func() { // owned by finish, which waits for it; Lost closes by Until at the latest
			<-lost
			hd.LostAt = w.hist.now()
			done <- i
		}()
		lives[i] = w.track(ci, fmt.Sprintf("c%d#%d", ci, seq), lk.Key(), lk, w.placeOf("", lk.Key()))
	}
	steps := r.IntN(min(3, w.sc.holdSteps()))
	for step := range steps {
		sleep(time.Duration(r.Int64N(int64(ttl * 7 / 10))))
		if valid() {
			sleep(w.writePause(ci, seq, step, ttl))
			for _, lk := range locks {
				w.hist.write(ci, seq, lk.Key(), lk.Fence())
			}
		}
	}
	if release != nil {
		d := ms(r, 20, 200)
		ctx, cancel := context.WithTimeout(context.Background(), d)
		at := w.hist.now()
		for _, hd := range holds {
			hd.RelSent = at
		}
		err := release(ctx)
		cancel()
		w.checkCtx(ci, "release", strings.Join(keys, "+"), at, d, false)
		w.hist.logf("c%d#%d release %v: %v", ci, seq, keys, short(err))
	}
	return func() {
		for range locks {
			<-done
		}
		for i, lk := range locks {
			w.untrack(lives[i])
			hd := holds[i]
			hd.Until = w.untilV(ci, lk)
			hd.To = min(hd.LostAt, hd.Until)
			w.hist.logf("c%d#%d end %s: %s (%v)", ci, seq, lk.Key(), hd, short(lk.Err()))
			w.hist.addHold(hd)
		}
	}
}
