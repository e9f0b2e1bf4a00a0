package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/redlease/redlease"
)

// The Sem workload (semClient): every client takes permits of one
// semaphore of Permits permits (Locker.Semaphore "s", slots s#0 ...) with
// TryAcquire, Acquire or Do, or takes one with Acquire and abandons it as
// a crashed holder would (never renewed nor released: it ends at its
// TTL). Every permit is a Hold of its slot key, so overlap, fence-order,
// stale-accepted, release-kept-valid and state-valid examine each slot as
// they examine a single lock; the semaphore's own invariants are these:

// InvSemBound: more than Permits permits of the semaphore believed held
// at once: belief intervals [From, To) of Holds of its slots (any key
// "s#…", so that a permit on a key that is no slot counts too) that
// share an instant, counted at each Hold's From.
const InvSemBound = "sem-bound"

// InvSemWait: in a scenario without faults, an Acquire or Do with a
// deadline longer than every other client's holds put together failed:
// a waiter was never granted a permit that others released or let
// expire.
const InvSemWait = "sem-wait"

// InvSemHeldKind: TryAcquire or Acquire answered "all held"
// (ErrNotObtained, not ErrUnavailable) while a slot it tried was
// undecided (its error ErrUnavailable) and the call's ctx had not ended:
// an outage is never "all held". No fault excuses it. Examined: calls
// answered "all held".
const InvSemHeldKind = "sem-held-kind"

// semName is the semaphore of the Sem workload.
const semName = "s"

// semWait is the deadline of an Acquire or Do in a scenario without
// faults (InvSemWait): above every client's holds put together (Ops
// holds of at most 3 steps of 0.7 TTL each, plus their releases, or an
// abandoned permit's TTL), whatever the order the waiters are served in.
const semWait = 10 * time.Second

// InvSemWakeSlow: in a SemWake scenario (no faults), a permit's release
// was sent, while a client had been inside Acquire or Do since before it
// and still was semWakeFast after it, and nobody was granted a permit
// within semWakeFast of it: the release's notice did not end the wait.
// (Without the notice, the wait ends at a holder's expiry: the held
// slots' TTLs are 600 ms to 1 s, renewed every third of it.) Examined:
// such releases.
const InvSemWakeSlow = "sem-wake-slow"

// semWakeFast is sem-wake-slow's bound: a waiter's round in flight when
// the release lands (both slots, a round trip each: 4 maxOneWay), or its
// first round, its subscription and the check after it (6 maxOneWay);
// then the push (1) and the round it starts (4), and a few scheduler
// instants. Below it, a holder's expiry is at least 2/3 of 600 ms away.
const semWakeFast = 12*maxOneWay + 5*time.Millisecond

// semWakeBackoff is a SemWake client's retry delay (min = max): longer
// than every TTL, so that a wait ends at a notice or a holder's expiry.
const semWakeBackoff = 5 * time.Second

// semWaitRec is one Acquire or Do of a Sem client in a SemWake scenario:
// from its call to its grant (or its return, if not granted).
type semWaitRec struct {
	client   int
	from, to time.Duration
}

func init() {
	examinedIn[InvSemWakeSlow] = func(sc *Scenario) bool { return sc.SemWake }
	examinedIn[InvSemBound] = func(sc *Scenario) bool { return sc.Permits > 0 }
	examinedIn[InvSemWait] = func(sc *Scenario) bool { return sc.Permits > 0 && !sc.Faults }
	examinedIn[InvSemHeldKind] = func(sc *Scenario) bool { return sc.Permits > 0 }
}

// semClient is one Sem client (see above).
func (w *World) semClient(ci int, locker *redlease.Locker, r *rand.Rand) {
	sem := must(locker.Semaphore(semName, w.sc.Permits))
	for seq := range w.sc.Ops {
		ttl := w.drawTTL(r)
		cd := ms(r, 20, 400)
		if !w.sc.Faults {
			cd = semWait
		}
		ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), ci, jitSem, seq), cd)
		start := w.hist.now()
		var err error
		via := [...]string{"tryacquire", "acquire", "do", "abandon"}[r.IntN(4)]
		opts := []redlease.LockOption{redlease.WithTTL(ttl)}
		if w.sc.SemWake {
			opts = append(opts, redlease.WithRetryDelay(semWakeBackoff, semWakeBackoff))
		}
		switch via {
		case "tryacquire", "acquire", "abandon":
			var lk *redlease.Lock
			if via == "tryacquire" {
				lk, err = sem.TryAcquire(ctx, opts...)
			} else {
				lk, err = sem.Acquire(ctx, opts...)
				w.semWaited(ci, start)
			}
			w.checkCtx(ci, via, semName, start, cd, true)
			w.semHeldKind(ctx, ci, seq, via, err)
			if err == nil {
				var release func(context.Context) error
				if via != "abandon" {
					release = lk.Release
				}
				w.holdPermit(ci, seq, via, ttl, lk, r, release)()
			}
		case "do":
			var finish func()
			granted := false
			err = sem.Do(ctx, func(_ context.Context, lk *redlease.Lock) error {
				granted = true
				w.semWaited(ci, start)
				finish = w.holdPermit(ci, seq, via, ttl, lk, r, nil)
				return nil
			}, opts...)
			if !granted {
				w.semWaited(ci, start)
			}
			if finish != nil {
				finish()
			}
		}
		cancel()
		if via != "tryacquire" && !w.sc.Faults {
			w.hist.ex.count(InvSemWait, 1)
			if err != nil {
				w.hist.violation(Violation{Inv: InvSemWait, At: w.hist.now(), Detail: fmt.Sprintf(
					"c%d#%d %s %s called at %.3fms with %v, no fault drawn: %v", ci, seq, via, semName, msf(start), cd, short(err))})
			}
		}
		if err != nil {
			w.hist.failed()
			w.hist.logf("c%d#%d %s %s ttl=%v: %v", ci, seq, via, semName, ttl, short(err))
			sleep(ms(r, 0, 30))
			continue
		}
		sleep(ms(r, 0, 20))
	}
}

// semHeldKind checks sem-held-kind for one TryAcquire or Acquire that
// returned err under ctx.
func (w *World) semHeldKind(ctx context.Context, ci, seq int, via string, err error) {
	if !errors.Is(err, redlease.ErrNotObtained) || errors.Is(err, redlease.ErrUnavailable) {
		return
	}
	w.hist.ex.count(InvSemHeldKind, 1)
	if ctx.Err() != nil {
		return // slots the deadline cut short decide nothing
	}
	var pe *redlease.PermitError
	if !errors.As(err, &pe) {
		w.hist.violation(Violation{Inv: InvSemHeldKind, At: w.hist.now(), Detail: fmt.Sprintf(
			"c%d#%d %s: answered \"all held\" without the slots' errors (*redlease.PermitError): %v", ci, seq, via, err)})
		return
	}
	for i, e := range pe.Slots {
		if e != nil && errors.Is(e, redlease.ErrUnavailable) {
			w.hist.violation(Violation{Inv: InvSemHeldKind, At: w.hist.now(), Detail: fmt.Sprintf(
				"c%d#%d %s: answered \"all held\" (ErrNotObtained) with slot %d undecided: %v", ci, seq, via, i, err)})
			return
		}
	}
}

// holdPermit runs a permit's hold (holdLocks); release, if not nil, ends
// it.
func (w *World) holdPermit(ci, seq int, via string, ttl time.Duration, lk *redlease.Lock, r *rand.Rand, release func(context.Context) error) (finish func()) {
	return w.holdLocks(ci, seq, via, ttl, []*redlease.Lock{lk}, lk.Valid, release, r)
}

// semWaited records, in a SemWake scenario, client ci's Acquire or Do
// called at from, now granted or returned.
func (w *World) semWaited(ci int, from time.Duration) {
	if !w.sc.SemWake {
		return
	}
	to := w.hist.now()
	w.mu.Lock()
	w.semWaits = append(w.semWaits, semWaitRec{client: ci, from: from, to: to})
	w.mu.Unlock()
}

// checkSem finds the instants at which more than Permits permits of the
// semaphore were believed held (InvSemBound), and in a SemWake scenario
// the releases whose notice ended no wait (InvSemWakeSlow).
func (w *World) checkSem() []Violation {
	if w.sc.Permits == 0 {
		return nil
	}
	w.hist.mu.Lock()
	var hs []*Hold
	for _, hd := range w.hist.holds {
		if strings.HasPrefix(hd.Key, semName+"#") && hd.To > hd.From {
			hs = append(hs, hd)
		}
	}
	w.hist.mu.Unlock()
	vs := w.checkSemWake(hs)
	slices.SortStableFunc(hs, func(a, b *Hold) int { return int(a.From - b.From) })
	for i, hd := range hs {
		w.hist.ex.count(InvSemBound, 1)
		var in []*Hold
		for _, o := range hs[:i+1] {
			if o.To > hd.From {
				in = append(in, o)
			}
		}
		if len(in) <= w.sc.Permits {
			continue
		}
		var names []string
		for _, o := range in {
			names = append(names, o.Key+" "+o.String())
		}
		vs = append(vs, Violation{Inv: InvSemBound, At: hd.From, Holds: in, Detail: fmt.Sprintf(
			"%d permits of %d believed held at once: %s", len(in), w.sc.Permits, strings.Join(names, ", "))})
	}
	return vs
}

// checkSemWake checks sem-wake-slow (see InvSemWakeSlow) over hs, the
// holds of the semaphore's slots.
func (w *World) checkSemWake(hs []*Hold) []Violation {
	if !w.sc.SemWake {
		return nil
	}
	w.mu.Lock()
	waits := slices.Clone(w.semWaits)
	w.mu.Unlock()
	var vs []Violation
	for _, rel := range hs {
		// A release sent while the lock was still valid: the slot was
		// held, and its release publishes.
		if rel.RelSent < 0 || rel.RelSent >= rel.Until {
			continue
		}
		bound := rel.RelSent + semWakeFast
		var waiting *semWaitRec
		for i, wt := range waits {
			if wt.client != rel.Client && wt.from < rel.RelSent && wt.to > bound {
				waiting = &waits[i]
				break
			}
		}
		if waiting == nil {
			continue
		}
		w.hist.ex.count(InvSemWakeSlow, 1)
		served := false
		for _, o := range hs {
			if o.From > rel.RelSent && o.From <= bound {
				served = true
				break
			}
		}
		if !served {
			vs = append(vs, Violation{Inv: InvSemWakeSlow, At: bound, Holds: []*Hold{rel}, Detail: fmt.Sprintf(
				"%s released by c%d at %.3fms while c%d waited (since %.3fms, until %.3fms): nobody granted a permit by %.3fms",
				rel.Key, rel.Client, msf(rel.RelSent), waiting.client, msf(waiting.from), msf(waiting.to), msf(bound))})
		}
	}
	return vs
}
