package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redlease/redlease"
)

// lockClient is one workload client: Ops times it takes a key with Lock
// or TryLock, holds it for a while (writing to the fenced register while
// the lock says it is valid, extending it now and then), and releases it,
// sometimes with a ctx too short for the reply, sometimes not at all.
func (w *World) lockClient(ci int, locker *redlease.Locker, r *rand.Rand) {
	for seq := range w.sc.Ops {
		ki := r.IntN(w.sc.Keys)
		key := fmt.Sprintf("k%d", ki)
		if w.sc.Strategy == FailoverCluster {
			key = w.cfKey(ki)
		}
		ttl := w.drawTTL(r)
		via := "lock"
		cd := ms(r, 20, 400)
		ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), ci, jitLock, seq), cd)
		start := w.hist.now()
		var lk *redlease.Lock
		var err error
		if r.IntN(3) == 0 {
			via = "trylock"
			lk, err = locker.TryLock(ctx, key, redlease.WithTTL(ttl))
		} else {
			// Retry at once (retryAtOnce) a bounded number of times,
			// and back off between Lock calls with the client's seeded
			// draws.
			lk, err = locker.Lock(ctx, key, redlease.WithTTL(ttl), retryAtOnce(), redlease.WithMaxAttempts(2+r.IntN(5)))
		}
		cancel()
		w.checkCtx(ci, via, key, start, cd, true)
		if err != nil {
			w.hist.failed()
			w.hist.logf("c%d#%d %s %s ttl=%v: %v", ci, seq, via, key, ttl, short(err))
			sleep(ms(r, 0, 30))
			continue
		}
		w.hold(ci, seq, key, via, ttl, lk, r)
		sleep(ms(r, 0, 20))
	}
}

// hold runs one grant to its end and records its belief interval.
func (w *World) hold(ci, seq int, key, via string, ttl time.Duration, lk *redlease.Lock, r *rand.Rand) {
	hd := &Hold{Client: ci, Seq: seq, Key: key, Via: via, Fence: lk.Fence(), From: w.hist.now(), LostAt: -1, RelSent: -1, Token: lk.Token()}
	w.hist.logf("c%d#%d %s %s ttl=%v granted fence=%d until=+%.3fms", ci, seq, via, key, ttl, lk.Fence(), msf(time.Until(lk.Until())))
	if !w.opts.LostFirst {
		// Valid first, then Lost (-lostfirst: Lost first, as Locker.Do
		// calls them; a first Lost call after the deadline once closed
		// its channel twice, TestFindingLostAfterDeadline). No virtual
		// time passes between the two calls.
		_ = lk.Valid()
	}
	lost, perr := safeLost(lk)
	if perr != nil {
		w.hist.violation(Violation{Inv: InvPanic, At: w.hist.now(), Detail: fmt.Sprintf("c%d#%d %s: Lock.Lost panicked: %v (grant until=+%.3fms, loss margin passed)", ci, seq, key, perr, msf(time.Until(lk.Until())))})
		c := make(chan struct{})
		close(c)
		lost = c
	}
	done := make(chan struct{})
	go func() { // owned by this call, which waits for it below; Lost closes by Until at the latest
		<-lost
		hd.LostAt = w.hist.now()
		close(done)
	}()
	live := w.track(ci, fmt.Sprintf("c%d#%d", ci, seq), key, lk, w.placeOf("", key))
	defer w.untrack(live)
	steps := r.IntN(w.sc.holdSteps())
	for step := range steps {
		sleep(time.Duration(r.Int64N(int64(ttl * 7 / 10))))
		if lk.Valid() {
			sleep(w.writePause(ci, seq, step, ttl))
			w.hist.write(ci, seq, key, lk.Fence())
		}
		if r.IntN(2) == 0 {
			ttl2 := w.drawTTL(r)
			if !w.sc.ShortExtends {
				// Never shorter than the validity left (ShortExtends
				// draws those: the case of TestFindingShortExtend).
				ttl2 = max(ttl2, time.Until(lk.Until())+time.Millisecond)
			}
			if w.sc.DelayedRestart > 0 && r.IntN(w.sc.pastMax()) == 0 {
				ttl2 = w.sc.DelayedRestart * 3 / 2 // past the rule's max TTL: must be refused
			}
			cd := ms(r, 5, 200)
			ctx, cancel := context.WithTimeout(context.Background(), cd)
			start := w.hist.now()
			err := lk.Extend(ctx, ttl2)
			cancel()
			w.checkCtx(ci, "extend", key, start, cd, false)
			w.hist.logf("c%d#%d extend %s ttl=%v: %v", ci, seq, key, ttl2, short(err))
			w.checkLock(live)
		}
	}
	if r.IntN(10) > 0 {
		d := ms(r, 20, 200)
		if r.IntN(4) == 0 {
			d = time.Duration(r.Int64N(int64(3 * time.Millisecond))) // shorter than a round trip, often
		}
		ctx, cancel := context.WithTimeout(context.Background(), d)
		hd.RelSent = w.hist.now()
		err := lk.Release(ctx)
		cancel()
		w.checkCtx(ci, "release", key, hd.RelSent, d, false)
		w.hist.logf("c%d#%d release %s: %v (valid after: %v)", ci, seq, key, short(err), lk.Valid())
		if err != nil && lk.Valid() {
			// The lock still claims validity: a holder goes on using it,
			// then tries the release again.
			sleep(time.Duration(r.Int64N(int64(ttl / 2))))
			if lk.Valid() {
				w.hist.write(ci, seq, key, lk.Fence())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			start := w.hist.now()
			_ = lk.Release(ctx)
			cancel()
			w.checkCtx(ci, "release", key, start, 100*time.Millisecond, false)
		}
	}
	<-done
	hd.Until = w.untilV(ci, lk)
	hd.To = min(hd.LostAt, hd.Until)
	w.hist.logf("c%d#%d end %s: %s (%v)", ci, seq, key, hd, short(lk.Err()))
	w.hist.addHold(hd)
}

// safeLost calls lk.Lost, turning a panic into an error.
func safeLost(lk *redlease.Lock) (ch <-chan struct{}, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	return lk.Lost(), nil
}

func (w *World) drawTTL(r *rand.Rand) time.Duration {
	lo, hi := w.sc.TTL[0], w.sc.TTL[1]
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1)).Truncate(time.Millisecond)
}

// sleep waits d of virtual time.
func sleep(d time.Duration) {
	if d > 0 {
		time.Sleep(d)
	}
}

// sleepCtx waits d of virtual time, or until ctx ends if that comes
// first; it reports whether the whole of d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// short is err's message, or "ok".
func short(err error) string {
	if err == nil {
		return "ok"
	}
	var s string
	switch {
	case errors.Is(err, redlease.ErrNotObtained):
		s = "not obtained"
	case errors.Is(err, redlease.ErrNotHeld):
		s = "not held"
	case errors.Is(err, redlease.ErrInvalid):
		s = "invalid"
	case errors.Is(err, redlease.ErrUnavailable):
		s = "unavailable"
	case errors.Is(err, redlease.ErrLost):
		s = "lost"
	default:
		s = "error"
	}
	msg := err.Error()
	if len(msg) > 120 {
		msg = msg[:120] + "…"
	}
	return s + ": " + msg
}
