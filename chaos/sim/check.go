package sim

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Verdicts of a Result, with the meaning the chaos package gives them.
const (
	// Pass: every invariant held.
	Pass = "PASS"
	// Hazard: only invariants that a fault outside the strategy's
	// assumptions may break were broken.
	Hazard = "HAZARD"
	// Fail: an invariant broke where the strategy promises it.
	Fail = "FAIL"
)

// Invariants, as named in Violations.
const (
	InvOverlap     = "overlap"            // two belief intervals of one key intersect
	InvFenceOrder  = "fence-order"        // a later holder got a fence not above an earlier one's
	InvStale       = "stale-accepted"     // the fenced register accepted a stale fence
	InvReleaseKept = "release-kept-valid" // Lost still open after a Release was sent
	InvTwice       = "effect-twice"       // an idempotency key's handler effect happened twice
	// InvHandlerOverlap: two Barrier handlers of one key ran at once, each
	// with a live ctx.
	InvHandlerOverlap = "handler-overlap"
	InvPastExpiry     = "held-past-expiry" // a lock claimed validity while fewer than a quorum of its nodes held it
	InvLeak           = "goroutine-leak"   // a goroutine outlived the run
	InvStuck          = "stuck"            // the run did not end (a bound was hit)
	InvPanic          = "panic"            // the library panicked
	InvBusyRetry      = "renew-busy-retry" // a lock's renewals to a node answering errors came closer than the retry delay
	InvHealthyLost    = "healthy-lost"     // a lock the network and the faults left enough time and nodes to renew was lost
	// InvFailoverKept: a lock the old primary granted was still believed
	// held past the watcher bound after a healthy Sentinel named the new
	// primary (failover).
	InvFailoverKept = "failover-kept"
)

// Hold is one holder's belief interval: from the moment Lock/TryLock
// returned the grant to the moment the lock stopped claiming validity
// (Lost closed: released, lost or expired), capped at Until.
type Hold struct {
	Client  int
	Seq     int // the client's acquisition number
	Key     string
	Via     string // "lock", "trylock", "do"
	Fence   uint64
	From    time.Duration
	To      time.Duration
	Until   time.Duration // last Until seen
	LostAt  time.Duration // -1: never closed (should not happen)
	RelSent time.Duration // -1: no Release sent by the workload
	// Watchdog workload only (Strat != ""):
	Strat     string        // "q", "s" or "c" (the Cluster)
	Token     string        // the lock's token on the nodes
	TTL       time.Duration // the lock's TTL (the watchdog renews every TTL/3)
	End       time.Duration // fn's return
	Until0    time.Duration // Until at the grant
	Cause     string        // lost: the lock's Err
	HeldOn    []int         // the nodes that held its token at the grant
	WrongType bool          // the lock's Err names WRONGTYPE
	// Revoked (Revoke workload): > 0, an operator's forced release that
	// may have deleted its token was sent then (revokework.go).
	Revoked time.Duration
}

// Violation is one broken invariant. Hazard says a fault outside the
// strategy's assumptions can have caused it: the Scope of such a fault
// covers one of its Holds (scope.go); Faults names those faults' kinds,
// Excused the faults (their index in the schedule).
type Violation struct {
	Inv     string
	At      time.Duration
	Detail  string
	Hazard  bool
	Faults  []string
	Excused []int
	Holds   []*Hold // the holds it names, if any
	// Nodes and Short (state-valid): the nodes that did not hold the
	// lock long enough, and how many more holding nodes it needed. A
	// scope excuses such a violation only if it touched one of Nodes, and
	// the scopes that excuse it together touched at least Short of them:
	// a node no outside fault touched must not fall short by itself.
	Nodes []int
	Short int
}

func (v Violation) String() string {
	s := fmt.Sprintf("%s at %.3fms: %s", v.Inv, float64(v.At)/float64(time.Millisecond), v.Detail)
	if v.Hazard {
		s += fmt.Sprintf(" [hazard: %s, faults %v]", strings.Join(v.Faults, ","), v.Excused)
	}
	return s
}

// regWrite is one write to the fenced register.
type regWrite struct {
	client, seq int
	key         string
	fence       uint64
	at          time.Duration
	accepted    bool
}

// history records what the clients did, on the run's virtual clock.
type history struct {
	start time.Time

	mu       sync.Mutex
	holds    []*Hold
	writes   []regWrite
	effects  map[string][]effectRec // idempotency key → effects the fenced store accepted
	effFence map[string]uint64
	runErr   map[effectRun]error // what Do returned to each run's caller
	// mustRecord, if set, says which runs' outcomes the Barrier must
	// have recorded whatever their caller was told (the idempotency
	// workloads, idemwork.go: see history.unknownLocked).
	mustRecord func(effectRun) bool
	spans      map[string][]*handlerSpan
	excused    int             // repeated effects after an unknown outcome
	lines      []string        // the log printed on replay
	ats        []time.Duration // each line's virtual time (-1: a check's line, after the run)
	fails      int             // failed lock attempts
	reg        map[string]uint64
	keep       bool // keep log lines
	direct     []Violation
	ex         examinedCounts // what the invariants examined (examined.go)
}

// violation records a violation seen directly by the workload.
func (h *history) violation(v Violation) {
	h.mu.Lock()
	h.direct = append(h.direct, v)
	h.mu.Unlock()
	h.logf("VIOLATION %s", v)
}

func newHistory(start time.Time, keep bool) *history {
	return &history{start: start, effects: map[string][]effectRec{}, effFence: map[string]uint64{}, runErr: map[effectRun]error{}, spans: map[string][]*handlerSpan{}, reg: map[string]uint64{}, keep: keep}
}

func (h *history) now() time.Duration { return time.Since(h.start) }

func (h *history) logf(format string, args ...any) {
	if !h.keep {
		return
	}
	at := h.now()
	line := fmt.Sprintf("%9.3fms ", float64(at)/float64(time.Millisecond)) + fmt.Sprintf(format, args...)
	h.mu.Lock()
	h.lines = append(h.lines, line)
	h.ats = append(h.ats, at)
	h.mu.Unlock()
}

func (h *history) event(what string) { h.logf("fault %s", what) }

func (h *history) addHold(hd *Hold) {
	h.mu.Lock()
	h.holds = append(h.holds, hd)
	h.mu.Unlock()
}

// write offers fence to the register of key: accepted only if strictly
// above the last accepted fence (the storage the fences protect; never
// faulted).
func (h *history) write(client, seq int, key string, fence uint64) bool {
	h.mu.Lock()
	ok := fence > h.reg[key]
	if ok {
		h.reg[key] = fence
	}
	h.writes = append(h.writes, regWrite{client, seq, key, fence, h.nowLocked(), ok})
	h.mu.Unlock()
	h.logf("c%d register %s fence=%d accepted=%v", client, key, fence, ok)
	return ok
}

func (h *history) nowLocked() time.Duration { return time.Since(h.start) }

func (h *history) failed() {
	h.mu.Lock()
	h.fails++
	h.mu.Unlock()
}

// check finds every violation in the history. fenced: the strategy hands
// out fences that must rise.
func (h *history) check(fenced bool) []Violation {
	h.mu.Lock()
	defer h.mu.Unlock()
	vs := append([]Violation(nil), h.direct...)
	byKey := map[string][]*Hold{}
	var keys []string
	for _, hd := range h.holds {
		if hd.To <= hd.From {
			continue // never valid: nothing believed
		}
		if _, ok := byKey[hd.Key]; !ok {
			keys = append(keys, hd.Key)
		}
		byKey[hd.Key] = append(byKey[hd.Key], hd)
	}
	slices.Sort(keys)
	for _, k := range keys {
		hs := byKey[k]
		slices.SortStableFunc(hs, func(a, b *Hold) int { return cmp.Compare(a.From, b.From) })
		for i, a := range hs {
			h.ex.count(InvOverlap, len(hs)-i-1)
			for _, b := range hs[i+1:] {
				if a.Revoked > 0 && b.From >= a.Revoked && b.From < a.To {
					// Mutual exclusion ended for a at the force, by
					// design; fences must still rise.
					h.ex.count(ExRevokeExcused, 1)
				}
				if b.From >= a.To || a.Revoked > 0 && b.From >= a.Revoked {
					if fenced {
						h.ex.count(InvFenceOrder, 1)
					}
					if fenced && b.Fence <= a.Fence {
						vs = append(vs, Violation{Inv: InvFenceOrder, At: b.From, Detail: fmt.Sprintf("key %s: %s then %s", k, a, b), Holds: []*Hold{a, b}})
					}
					continue
				}
				vs = append(vs, Violation{Inv: InvOverlap, At: b.From, Detail: fmt.Sprintf("key %s: %s and %s overlap for %v", k, a, b, min(a.To, b.To)-b.From), Holds: []*Hold{a, b}})
			}
		}
	}
	for _, hd := range h.holds {
		if hd.RelSent >= 0 {
			h.ex.count(InvReleaseKept, 1)
		}
		if hd.RelSent >= 0 && (hd.LostAt < 0 || hd.LostAt > hd.RelSent) && hd.RelSent < hd.To {
			vs = append(vs, Violation{Inv: InvReleaseKept, At: hd.RelSent, Detail: fmt.Sprintf("%s: Release sent at %.3fms, Lost closed at %.3fms", hd, msf(hd.RelSent), msf(hd.LostAt)), Holds: []*Hold{hd}})
		}
	}
	vs = append(vs, h.staleLocked()...)
	vs = append(vs, h.twiceLocked()...)
	vs = append(vs, h.handlerOverlapLocked()...)
	return vs
}

// staleLocked finds accepted register writes that overwrote a value
// written under a later grant.
func (h *history) staleLocked() []Violation {
	from := map[[2]int]time.Duration{}
	holdOf := map[regHold]*Hold{}
	for _, hd := range h.holds {
		from[[2]int{hd.Client, hd.Seq}] = hd.From
		holdOf[regHold{hd.Client, hd.Seq, hd.Key}] = hd
	}
	last := map[string]regWrite{}
	var vs []Violation
	for _, w := range h.writes {
		if !w.accepted {
			continue
		}
		if _, ok := last[w.key]; ok {
			h.ex.count(InvStale, 1)
		}
		if p, ok := last[w.key]; ok && from[[2]int{p.client, p.seq}] > from[[2]int{w.client, w.seq}] {
			vs = append(vs, Violation{Inv: InvStale, At: w.at, Detail: fmt.Sprintf("key %s: c%d#%d fence %d (granted %.3fms) overwrote c%d#%d fence %d (granted later, %.3fms)",
				w.key, w.client, w.seq, w.fence, msf(from[[2]int{w.client, w.seq}]), p.client, p.seq, p.fence, msf(from[[2]int{p.client, p.seq}])),
				Holds: []*Hold{holdOf[regHold{w.client, w.seq, w.key}], holdOf[regHold{p.client, p.seq, p.key}]}})
		}
		last[w.key] = w
	}
	return vs
}

func (hd *Hold) String() string {
	return fmt.Sprintf("c%d#%d(%s fence=%d [%.3f,%.3f)ms until=%.3f)", hd.Client, hd.Seq, hd.Via, hd.Fence, msf(hd.From), msf(hd.To), msf(hd.Until))
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// regHold names the hold of a register write.
type regHold struct {
	client, seq int
	key         string
}

// excuse records, on each violation, the outside faults whose Scope
// covers one of its holds (scope.go): Excused and their kinds in Faults.
// A violation that names its nodes (state-valid) is excused only by
// scopes that touched one of them, and only if those scopes together
// touched as many of them as the lock lacked (Violation.Short).
func excuse(vs []Violation, scopes []Scope, votes map[string][]vote) {
	for i := range vs {
		v := &vs[i]
		v.Faults, v.Excused = nil, nil
		var touched []int // the violation's nodes the excusing scopes touched
		for _, s := range scopes {
			if s.At > v.At && v.At > 0 {
				continue // after the violation: it cannot have caused it
			}
			if v.Short > 0 && !s.touchesAny(v.Nodes) {
				continue
			}
			if len(v.Holds) == 0 && slices.Contains(s.Unheld, v.Inv) {
				v.Excused = append(v.Excused, s.Fault)
				if !slices.Contains(v.Faults, s.Kind) {
					v.Faults = append(v.Faults, s.Kind)
				}
				continue
			}
			for _, hd := range v.Holds {
				if s.covers(hd, v.Inv, votes) {
					v.Excused = append(v.Excused, s.Fault)
					if !slices.Contains(v.Faults, s.Kind) {
						v.Faults = append(v.Faults, s.Kind)
					}
					for _, n := range v.Nodes {
						if s.touches(n) && !slices.Contains(touched, n) {
							touched = append(touched, n)
						}
					}
					break
				}
			}
		}
		if v.Short > 0 && len(touched) < v.Short {
			v.Faults, v.Excused = nil, nil
		}
	}
}

// grade marks as hazards the violations an outside fault excused
// (excuse), and returns the verdict.
func grade(vs []Violation) string {
	verdict := Pass
	for i := range vs {
		v := &vs[i]
		v.Hazard = len(v.Excused) > 0
		if v.Inv == InvLeak || v.Inv == InvStuck || v.Inv == InvReleaseKept || v.Inv == InvPanic || v.Inv == InvFailoverKept || v.Inv == InvFIFO {
			v.Hazard = false // no fault excuses these
		}
		switch {
		case !v.Hazard:
			verdict = Fail
		case verdict == Pass:
			verdict = Hazard
		}
	}
	return verdict
}
