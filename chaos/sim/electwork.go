package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/redlease/redlease"
)

// The Elect workload (electClient): every client campaigns for the
// leadership of one election (redlease.Election on key k0) again and
// again. A leader writes to the fenced register with its term, proclaims
// new values and reads the leader back while it leads, then resigns; half
// of them then send a late proclamation under their old token and term
// (the request of a deposed leader that was still on its way). The
// leader's lock is a Hold of k0, so overlap (one leader at a time),
// fence-order and stale-accepted examine it as a lock. Every client also
// observes the election (electobserve.go, with invariants of its own). The
// election's own invariants are these:

// InvElectTerm: one leader per term, terms rising: no two Campaigns
// returned the same term, and a Campaign called after another returned
// has a higher term.
const InvElectTerm = "elect-term"

// InvElectValue: a Leader read sent and answered while a leader led (its
// lock valid before the read was sent and after it returned, no Resign
// sent) returned that leader's term and a value it proclaimed: no deposed
// leader's proclamation overwrote it.
const InvElectValue = "elect-value"

// InvElectLate: in a scenario without faults, a late proclamation of a
// leader that resigned (its Resign confirmed) under its old token and
// term was refused (ErrNotHeld): a deposed leader's proclamation is never
// written.
const InvElectLate = "elect-late"

// electKey is the election's key.
const electKey = "k0"

func init() {
	examinedIn[InvElectTerm] = func(sc *Scenario) bool { return sc.Elect }
	examinedIn[InvElectValue] = func(sc *Scenario) bool { return sc.Elect }
	examinedIn[InvElectLate] = func(sc *Scenario) bool { return sc.Elect && !sc.Faults }
}

// electState is what the Elect workload recorded: every Campaign that
// returned a leadership, the values each term proclaimed (or sent to be),
// those each leader recorded and kept, the values of Campaigns that
// failed, and the observers (electobserve.go).
type electState struct {
	mu             sync.Mutex
	terms          []electTerm
	values         map[uint64]map[string]bool
	records        []electRecord
	campaignFailed map[string]bool
	observers      []*electObserver
	over           chan struct{} // closed once every client's campaigns ended
	left           int           // clients whose campaigns have not ended
}

// electTerm is one Campaign that returned a leadership.
type electTerm struct {
	client, seq      int
	term             uint64
	called, returned time.Duration
}

// proclaimed records that term's leader sent (or is about to send) v.
func (s *electState) proclaimed(term uint64, v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.values == nil {
		s.values = map[uint64]map[string]bool{}
	}
	if s.values[term] == nil {
		s.values[term] = map[string]bool{}
	}
	s.values[term][v] = true
}

func (s *electState) wasProclaimed(term uint64, v string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.values[term][v]
}

// electWait is the deadline of a Campaign in a scenario without faults:
// above every client's leaderships put together.
const electWait = 10 * time.Second

// electClient is one Elect client (see above).
func (w *World) electClient(ci int, locker *redlease.Locker, r *rand.Rand) {
	e := must(redlease.NewElection(locker, electKey))
	w.elect.startCampaigns(w.sc.Clients)
	stop := w.observe(ci, e)
	defer stop()
	defer w.elect.endCampaigns()
	for seq := range w.sc.Ops {
		ttl := w.drawTTL(r)
		cd := ms(r, 50, 400)
		if !w.sc.Faults {
			cd = electWait
		}
		v := fmt.Sprintf("c%d#%d", ci, seq)
		ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), ci, jitElect, seq), cd)
		called := w.hist.now()
		ld, err := e.Campaign(ctx, v, redlease.WithTTL(ttl))
		cancel()
		w.checkCtx(ci, "campaign", electKey, called, cd, true)
		if err != nil {
			// Its value may have been recorded in a term it never learnt:
			// an observer that saw it is excused (elect-observe-known).
			w.elect.mu.Lock()
			if w.elect.campaignFailed == nil {
				w.elect.campaignFailed = map[string]bool{}
			}
			w.elect.campaignFailed[v] = true
			w.elect.mu.Unlock()
			w.hist.failed()
			w.hist.logf("c%d#%d campaign ttl=%v: %v", ci, seq, ttl, short(err))
			sleep(ms(r, 0, 30))
			continue
		}
		w.lead(ci, seq, e, ld, ttl, called, v, r)
		sleep(ms(r, 0, 20))
	}
}

// lead runs one leadership to its end: writes, proclamations and reads of
// the leader while it leads, the Resign, and maybe a late proclamation.
func (w *World) lead(ci, seq int, e *redlease.Election, ld *redlease.Leadership, ttl, called time.Duration, v string, r *rand.Rand) {
	lk := ld.Lock()
	term := ld.Term()
	st := &w.elect
	st.proclaimed(term, v)
	st.mu.Lock()
	st.terms = append(st.terms, electTerm{client: ci, seq: seq, term: term, called: called, returned: w.hist.now()})
	st.mu.Unlock()
	hd := &Hold{Client: ci, Seq: seq, Key: electKey, Via: "campaign", Fence: term, From: w.hist.now(), LostAt: -1, RelSent: -1, Token: lk.Token(), TTL: ttl}
	w.hist.logf("c%d#%d elected ttl=%v term=%d until=+%.3fms", ci, seq, ttl, term, msf(time.Until(lk.Until())))
	lost := ld.Lost()
	done := make(chan struct{})
	go func() { // owned by this call, which waits for it below; Lost closes by Until at the latest
		<-lost
		hd.LostAt = w.hist.now()
		close(done)
	}()
	live := w.track(ci, fmt.Sprintf("c%d#%d", ci, seq), electKey, lk, w.placeOf("", electKey))
	// The values this leader recorded, each kept until the next Proclaim
	// sent (the last until the Resign sent or the loss: below).
	recs := []electRecord{{client: ci, seq: seq, term: term, value: v, confirmed: hd.From, until: -1}}
	for step := range 1 + r.IntN(3) {
		sleep(time.Duration(r.Int64N(int64(ttl / 2))))
		if !lk.Valid() {
			break
		}
		sleep(w.writePause(ci, seq, step, ttl))
		w.hist.write(ci, seq, electKey, term)
		if r.IntN(2) == 0 {
			nv := fmt.Sprintf("c%d#%d.%d", ci, seq, step)
			st.proclaimed(term, nv) // before it is sent: a read may see it before Proclaim returns
			ctx, cancel := context.WithTimeout(context.Background(), ms(r, 20, 200))
			sent := w.hist.now()
			if last := &recs[len(recs)-1]; last.until < 0 {
				last.until = sent
			}
			err := ld.Proclaim(ctx, nv)
			cancel()
			w.hist.logf("c%d#%d proclaim %q term=%d: %v", ci, seq, nv, term, short(err))
			if err == nil {
				recs = append(recs, electRecord{client: ci, seq: seq, term: term, value: nv, confirmed: w.hist.now(), until: -1})
			}
		}
		w.readLeader(ci, seq, e, lk, term)
	}
	d := ms(r, 20, 200)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	hd.RelSent = w.hist.now()
	err := ld.Resign(ctx)
	cancel()
	w.checkCtx(ci, "resign", electKey, hd.RelSent, d, false)
	w.hist.logf("c%d#%d resign term=%d: %v", ci, seq, term, short(err))
	<-done
	w.untrack(live)
	hd.Until = w.untilV(ci, lk)
	hd.To = min(hd.LostAt, hd.Until)
	w.hist.logf("c%d#%d end %s: %s (%v)", ci, seq, electKey, hd, short(lk.Err()))
	w.hist.addHold(hd)
	if last := &recs[len(recs)-1]; last.until < 0 {
		last.until = hd.RelSent
		if hd.LostAt >= 0 && hd.LostAt < last.until {
			last.until = hd.LostAt
		}
	}
	for _, rc := range recs {
		if rc.until >= 0 {
			st.mu.Lock()
			st.records = append(st.records, rc)
			st.mu.Unlock()
		}
	}
	if err == nil && r.IntN(2) == 0 {
		w.lateProclaim(ci, seq, lk, term, ttl, r)
	}
}

// readLeader reads the leader while client ci leads in term, and checks
// elect-value if the leadership held across the read.
func (w *World) readLeader(ci, seq int, e *redlease.Election, lk *redlease.Lock, term uint64) {
	valid := lk.Valid()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	got, err := e.Leader(ctx)
	cancel()
	if !valid || !lk.Valid() {
		return
	}
	w.hist.ex.count(InvElectValue, 1)
	if err != nil || got.Term != term || !w.elect.wasProclaimed(term, got.Value) {
		w.hist.violation(Violation{Inv: InvElectValue, At: w.hist.now(), Detail: fmt.Sprintf(
			"c%d#%d leads in term %d, its lock valid across the read, and read the leader as term %d value %q: %v", ci, seq, term, got.Term, got.Value, short(err))})
	}
}

// lateProclaim sends, after a confirmed Resign, a proclamation under the
// leadership's old token and term, as a deposed leader's request still on
// its way would arrive, and checks elect-late.
func (w *World) lateProclaim(ci, seq int, lk *redlease.Lock, term uint64, ttl time.Duration, r *rand.Rand) {
	el, ok := lk.Strategy().(redlease.Elector)
	if !ok {
		return
	}
	sleep(ms(r, 0, 100))
	v := fmt.Sprintf("late-c%d#%d", ci, seq)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err := el.Proclaim(ctx, electKey, lk.Token(), term, v, ttl, true)
	cancel()
	w.hist.logf("c%d#%d late proclaim %q term=%d: %v", ci, seq, v, term, short(err))
	if w.sc.Faults {
		return
	}
	w.hist.ex.count(InvElectLate, 1)
	if !errors.Is(err, redlease.ErrNotHeld) {
		w.hist.violation(Violation{Inv: InvElectLate, At: w.hist.now(), Detail: fmt.Sprintf(
			"c%d#%d resigned term %d (confirmed), and a late proclamation of %q under its token was not refused: %v", ci, seq, term, v, short(err))})
	}
}

// checkElect checks elect-term over every Campaign that returned, and the
// observers' invariants (checkObservers).
func (w *World) checkElect() []Violation {
	if !w.sc.Elect {
		return nil
	}
	st := &w.elect
	st.mu.Lock()
	defer st.mu.Unlock()
	var vs []Violation
	for i, a := range st.terms {
		for j, b := range st.terms {
			if i == j {
				continue
			}
			if i < j && a.term == b.term {
				w.hist.ex.count(InvElectTerm, 1)
				vs = append(vs, Violation{Inv: InvElectTerm, At: b.returned, Detail: fmt.Sprintf(
					"c%d#%d and c%d#%d were both elected in term %d", a.client, a.seq, b.client, b.seq, a.term)})
				continue
			}
			if a.returned < b.called {
				w.hist.ex.count(InvElectTerm, 1)
				if b.term <= a.term {
					vs = append(vs, Violation{Inv: InvElectTerm, At: b.returned, Detail: fmt.Sprintf(
						"c%d#%d was elected in term %d after c%d#%d's Campaign returned term %d", b.client, b.seq, b.term, a.client, a.seq, a.term)})
				}
			}
		}
	}
	return append(vs, w.checkObservers(st)...)
}
