package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/redlease/redlease"
)

// The Elect workload's observers: every client also watches the election
// (redlease.Election.Observe on its own Locker) from before its first
// Campaign until every client's campaigns ended, and records each leader
// the channel sends, at the virtual time its reader took it. Observe
// promises a channel of leaders in rising terms: the current one, then
// each new term and each new value a leader proclaims in its term
// (reported once, at its latest, if the reader is away; here the reader
// never is), learned from the election's notices (proclamations and
// releases) where it can, and by a read of the leader at least every max
// retry delay of the Locker otherwise. The invariants:

// InvElectObserveOrder: an observer's leaders never go back: each has a
// term above the one before it, or the same term with another value.
const InvElectObserveOrder = "elect-observe-order"

// InvElectObserveKnown: every leader an observer reported is a term's
// leader with a value that leader proclaimed (sent to be recorded), never
// a late proclamation of a resigned leader nor a value no leader sent.
const InvElectObserveKnown = "elect-observe-known"

// InvElectObserveTimely: in a scenario without faults (no notice is
// lost), a value recorded by a Campaign or a Proclaim that returned at t,
// whose leader then kept leading with it (its lock not lost, no Resign
// and no other Proclaim sent) until t plus electObserveSlack, was reported
// by then by every observer that was observing from before t until then:
// learned from the proclamation's notice, not from the fallback read a max
// retry delay (320 ms here) later.
const InvElectObserveTimely = "elect-observe-timely"

// electObserveSlack is what elect-observe-timely allows an observer after
// a proclamation returned: twenty one-way messages of the network without
// faults (baseDelay plus baseJitter each, 10 ms in all). The notice is one;
// each read of the leader is a round trip, three on a connection that must
// first be dialled and handshaken and whose node answers the script's
// EVALSHA with NOSCRIPT; a notice may find the observer in a read it began
// before the proclamation, so two such reads and the notice take thirteen.
const electObserveSlack = 20 * (baseDelay + baseJitter)

// electObserveMax bounds an observer in virtual time: it stops once every
// client's campaigns ended, or after this, whichever comes first.
const electObserveMax = 60 * time.Second

func init() {
	examinedIn[InvElectObserveOrder] = func(sc *Scenario) bool { return sc.Elect }
	examinedIn[InvElectObserveKnown] = func(sc *Scenario) bool { return sc.Elect }
	examinedIn[InvElectObserveTimely] = func(sc *Scenario) bool { return sc.Elect && !sc.Faults }
}

// electSeen is one leader an observer's channel sent.
type electSeen struct {
	at    time.Duration
	term  uint64
	value string
}

// electObserver is one observer's record: when it called Observe, when
// it cancelled it, and what it saw.
type electObserver struct {
	client        int
	from, stopped time.Duration
	seen          []electSeen
}

// electRecord is one value a Campaign or a Proclaim recorded (it returned
// without error at confirmed), held by its leader until until: the next
// Proclaim it sent, its Resign sent, or its loss, whichever came first.
type electRecord struct {
	client, seq      int
	term             uint64
	value            string
	confirmed, until time.Duration
}

// startCampaigns counts client ci's campaigns as begun; the first call
// makes the channel every observer waits on.
func (s *electState) startCampaigns(clients int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.over == nil {
		s.over = make(chan struct{})
		s.left = clients
	}
}

// endCampaigns counts one client's campaigns as ended, and closes over
// after the last.
func (s *electState) endCampaigns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.left--
	if s.left == 0 {
		close(s.over)
	}
}

// campaignsOver returns the channel closed once every client's campaigns
// ended (startCampaigns made it).
func (s *electState) campaignsOver() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.over
}

// observe starts client ci's observer of e and returns its stop, which
// the client calls once its own campaigns ended: stop waits for every
// client's to end (at most electObserveMax after the start), cancels
// Observe, and returns once its channel closed (Observe's goroutine has
// then closed its subscription), having recorded the observer.
func (w *World) observe(ci int, e *redlease.Election) (stop func()) {
	st := &w.elect
	o := &electObserver{client: ci, from: w.hist.now()}
	ctx, cancel := context.WithCancel(context.Background())
	ch := e.Observe(ctx)
	done := make(chan struct{})
	go func() { // owned by stop, which cancels ctx and waits for it
		defer close(done)
		for ld := range ch {
			at := w.hist.now()
			o.seen = append(o.seen, electSeen{at: at, term: ld.Term, value: ld.Value})
			w.hist.logf("o%d observed term=%d value=%q", ci, ld.Term, ld.Value)
		}
	}()
	start := time.Now()
	return func() {
		t := time.NewTimer(electObserveMax - time.Since(start))
		select {
		case <-st.campaignsOver():
		case <-t.C:
		}
		t.Stop()
		o.stopped = w.hist.now()
		cancel()
		<-done
		w.hist.logf("o%d stopped after %d observations", ci, len(o.seen))
		st.mu.Lock()
		st.observers = append(st.observers, o)
		st.mu.Unlock()
	}
}

// checkObservers checks elect-observe-order, elect-observe-known and
// elect-observe-timely over every observer's record, and, without
// faults, that each of them examined something in the run. Called with
// st.mu held.
func (w *World) checkObservers(st *electState) (vs []Violation) {
	n := map[string]int{}
	count := func(inv string) {
		w.hist.ex.count(inv, 1)
		n[inv]++
	}
	for _, o := range st.observers {
		for i, s := range o.seen {
			count(InvElectObserveKnown)
			if !st.values[s.term][s.value] && !st.campaignFailed[s.value] {
				vs = append(vs, Violation{Inv: InvElectObserveKnown, At: s.at, Detail: fmt.Sprintf(
					"observer o%d saw term %d value %q, which no leader of that term proclaimed", o.client, s.term, s.value)})
			}
			if i == 0 {
				continue
			}
			p := o.seen[i-1]
			count(InvElectObserveOrder)
			if s.term < p.term || s.term == p.term && s.value == p.value {
				vs = append(vs, Violation{Inv: InvElectObserveOrder, At: s.at, Detail: fmt.Sprintf(
					"observer o%d saw term %d value %q at %.3fms after term %d value %q at %.3fms", o.client, s.term, s.value, msf(s.at), p.term, p.value, msf(p.at))})
			}
		}
	}
	if w.sc.Faults {
		return vs
	}
	// Without faults every run has leaders to see, and values kept past
	// the slack (2,000 of 2,000 seeds examined each): a run in which one
	// of the three examined nothing has an observer that saw nothing, or
	// a check that looked at nothing.
	defer func() {
		for _, inv := range []string{InvElectObserveOrder, InvElectObserveKnown, InvElectObserveTimely} {
			if n[inv] == 0 {
				vs = append(vs, Violation{Inv: inv, At: w.hist.now(), Detail: fmt.Sprintf(
					"examined nothing in this run without faults (%d observers, %d recorded values)", len(st.observers), len(st.records))})
			}
		}
	}()
	for _, r := range st.records {
		by := r.confirmed + electObserveSlack
		if r.until <= by {
			continue
		}
		for _, o := range st.observers {
			if o.from > r.confirmed || o.stopped < by {
				continue
			}
			count(InvElectObserveTimely)
			if !o.sawBy(r.term, r.value, by) {
				vs = append(vs, Violation{Inv: InvElectObserveTimely, At: by, Detail: fmt.Sprintf(
					"c%d#%d recorded %q in term %d at %.3fms and kept it until %.3fms; observer o%d (observing %.3f-%.3fms) had not seen it %v later (last seen before: %s)",
					r.client, r.seq, r.value, r.term, msf(r.confirmed), msf(r.until), o.client, msf(o.from), msf(o.stopped), electObserveSlack, o.lastBy(by))})
			}
		}
	}
	return vs
}

// sawBy reports whether the observer saw term with value, or a later
// term, by time by.
func (o *electObserver) sawBy(term uint64, value string, by time.Duration) bool {
	for _, s := range o.seen {
		if s.at > by {
			break
		}
		if s.term > term || s.term == term && s.value == value {
			return true
		}
	}
	return false
}

// lastBy describes the last leader the observer saw by time by.
func (o *electObserver) lastBy(by time.Duration) string {
	last := "nothing"
	for _, s := range o.seen {
		if s.at > by {
			break
		}
		last = fmt.Sprintf("term %d value %q at %.3fms", s.term, s.value, msf(s.at))
	}
	return last
}
