package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Verdicts of a Result.
const (
	// VerdictPass: every oracle held.
	VerdictPass = "PASS"
	// VerdictHazard: only oracles the Expectation allows were violated —
	// the documented hazard of running the strategy outside its assumptions.
	VerdictHazard = "HAZARD"
	// VerdictFail: a required oracle was violated or could not be checked.
	VerdictFail = "FAIL"
)

// Linearizability outcomes in Result.Linearizability.
const (
	LinOK      = "ok"      // porcupine found a linearization
	LinIllegal = "illegal" // porcupine proved there is none
	LinUnknown = "unknown" // porcupine timed out
)

// checkTimeout bounds the linearizability check: it is NP-hard, and a
// scenario's report is worth more than an answer that never comes.
const checkTimeout = 10 * time.Second

// Result is the judgement of one scenario: what was counted for each oracle,
// what the scenario allowed, and the verdict that follows. Counts are exact
// for what was recorded; the verdict never reads more into them.
type Result struct {
	Scenario, Strategy, Faults string

	Grants   int // holds recorded
	Failures int // lock attempts that failed (expected under faults)

	// Overlaps (O2) counts pairs of holds of one key by different holders
	// whose [From, To) intervals intersect.
	Overlaps int
	// StaleAccepted (O1) counts accepted writes that overwrote a value
	// written by a holder granted later than the writer: the harm fences
	// exist to prevent. It is 0 whenever fences rise strictly with grants.
	StaleAccepted int
	// StaleRejected counts writes the register refused (fence not above the
	// last accepted): fences doing their job, not a violation.
	StaleRejected int
	// Linearizable (O1) is true only when porcupine found a linearization of
	// the register history against the fenced-register model. It is false
	// both when none exists and when the check timed out; Linearizability
	// tells the two apart.
	Linearizable bool
	// Linearizability is LinOK, LinIllegal or LinUnknown.
	Linearizability string
	// LostLate (O5) counts holds whose LostAt is at or after their Until.
	// Holds that were never lost do not count.
	LostLate int
	// StrayKeys (O3) counts lock keys still present after TTL plus epsilon.
	// The recorder cannot see them: the scenario sets it after Check and
	// calls Judge.
	StrayKeys int
	// LedgerLost (O4) counts acknowledged ledger entries found missing; set
	// by the scenario like StrayKeys.
	LedgerLost int

	Expect  Expectation
	Verdict string // VerdictPass, VerdictHazard or VerdictFail
	// Notes starts with the reasons for the verdict (one per violated
	// oracle), followed by details: stale writes, unchecked writes, failed
	// attempts, and whatever the scenario appends.
	Notes []string

	// reasons are the notes Judge put at the front of Notes, so that a
	// second Judge replaces them instead of repeating them.
	reasons []string
	// info is porcupine's linearization of this history, kept so that
	// WriteReport can visualise it without checking again.
	info *porcupine.LinearizationInfo
}

// Expectation says which oracles may be violated in a scenario because the
// fault lies outside the strategy's assumptions, where the violation is the
// documented hazard (e.g. single failing over before replication may
// overlap: AllowOverlap). O1 is always required: fences must protect
// storage whatever the lock did.
type Expectation struct {
	AllowOverlap    bool // O2
	AllowStrays     bool // O3
	AllowLedgerLoss bool // O4
	AllowLostLate   bool // O5
	Why             string
}

// Failed reports whether a Go test should fail on this result: when its
// verdict is FAIL, and also when it has none (a Result that was never
// judged has shown nothing).
func (res Result) Failed() bool {
	return res.Verdict != VerdictPass && res.Verdict != VerdictHazard
}

// Slug is the file-name stem of this result's report files: scenario and
// strategy in lower case, with everything but letters and digits turned
// into single dashes.
func (res Result) Slug() string {
	name := res.Scenario
	if res.Strategy != "" {
		name += "-" + res.Strategy
	}
	var b strings.Builder
	dash := false
	for _, c := range strings.ToLower(name) {
		if ('a' <= c && c <= 'z') || ('0' <= c && c <= '9') {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			b.WriteRune(c)
			dash = false
		} else {
			dash = true
		}
	}
	if b.Len() == 0 {
		return "scenario"
	}
	return b.String()
}

// Check judges everything recorded so far against the oracles, for a run of
// strategy under faults (both only labels). It may take up to the
// linearizability timeout (10 s) on a large history. StrayKeys and
// LedgerLost are 0 in the result; a scenario that counts them sets them and
// calls Judge.
func (r *Recorder) Check(strategy, faults string, exp Expectation) Result {
	rec := r.snapshot()
	res := Result{
		Scenario: r.scenario,
		Strategy: strategy,
		Faults:   faults,
		Grants:   len(rec.holds),
		Failures: len(rec.failures),
		Overlaps: len(findOverlaps(rec.holds)),
		LostLate: countLostLate(rec.holds),
		Expect:   exp,
	}
	staleWrites, details := findStale(rec.holds, rec.ops)
	res.StaleAccepted = len(staleWrites)
	res.StaleRejected = countRejected(rec.ops)

	outcome, info := checkLinearizable(rec.ops, checkTimeout)
	res.Linearizability = linearizability(outcome)
	res.Linearizable = outcome == porcupine.Ok
	res.info = info

	res.Notes = append(details, recordingNotes(rec)...)
	return Judge(res)
}

// Judge decides res.Verdict from its counts and Expect alone, and puts the
// reasons (one note per violated oracle) at the front of res.Notes,
// replacing those of an earlier Judge. Check calls it; call it again after
// changing a count, such as StrayKeys or LedgerLost, so the verdict
// follows. The rules: O1 (Linearizable, StaleAccepted) is always required;
// O2–O5 are required unless Expect allows them; any required violation is
// FAIL, only allowed ones HAZARD, none PASS.
func Judge(res Result) Result {
	notes := res.Notes
	if len(res.reasons) <= len(notes) && slices.Equal(notes[:len(res.reasons)], res.reasons) {
		notes = notes[len(res.reasons):]
	}
	var reasons []string
	res.Verdict, reasons = verdict(res)
	res.reasons = reasons
	res.Notes = append(slices.Clip(reasons), notes...)
	return res
}

// verdict is the rule, with the oracles that decided it.
func verdict(res Result) (string, []string) {
	var fails, hazards []string
	if !res.Linearizable {
		if res.Linearizability == LinUnknown {
			fails = append(fails, fmt.Sprintf("O1 not established: porcupine timed out after %s, linearizability unknown", checkTimeout))
		} else {
			fails = append(fails, "O1 violated: the register history is not linearizable")
		}
	}
	if res.StaleAccepted > 0 {
		fails = append(fails, fmt.Sprintf("O1 violated: %d stale writes accepted", res.StaleAccepted))
	}
	oracle := func(name string, n int, allowed bool, what string) {
		switch {
		case n == 0:
		case allowed:
			hazards = append(hazards, fmt.Sprintf("%s violated as documented: %d %s", name, n, what))
		default:
			fails = append(fails, fmt.Sprintf("%s violated: %d %s", name, n, what))
		}
	}
	oracle("O2", res.Overlaps, res.Expect.AllowOverlap, "overlaps")
	oracle("O3", res.StrayKeys, res.Expect.AllowStrays, "stray keys")
	oracle("O4", res.LedgerLost, res.Expect.AllowLedgerLoss, "acknowledged ledger entries lost")
	oracle("O5", res.LostLate, res.Expect.AllowLostLate, "holds lost late")

	notes := append(fails, hazards...)
	if len(hazards) > 0 && res.Expect.Why != "" {
		notes = append(notes, "documented hazard: "+res.Expect.Why)
	}
	switch {
	case len(fails) > 0:
		return VerdictFail, notes
	case len(hazards) > 0:
		return VerdictHazard, notes
	default:
		return VerdictPass, notes
	}
}

// overlap is the intersection of two holds (indexes into the holds slice)
// by different holders.
type overlap struct {
	a, b     int
	from, to time.Duration
}

// findOverlaps returns every pair of holds of one key by different holders
// whose [From, To) intervals intersect. Half-open intervals make a hand-over at
// the same instant legal, and a holder's own re-grant is not an overlap: it
// cannot harm itself.
func findOverlaps(holds []Hold) []overlap {
	order := make([]int, len(holds))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(i, j int) int { return cmp.Compare(holds[i].From, holds[j].From) })
	var out []overlap
	for x, i := range order {
		hi := holds[i]
		if hi.To <= hi.From {
			continue
		}
		// Sorted by From, so once a later hold starts at or after hi.To no
		// further hold can meet hi.
		for _, j := range order[x+1:] {
			hj := holds[j]
			if hj.From >= hi.To {
				break
			}
			if hj.To <= hj.From || hj.Holder == hi.Holder || hj.Key != hi.Key {
				continue
			}
			out = append(out, overlap{a: i, b: j, from: hj.From, to: min(hi.To, hj.To)})
		}
	}
	return out
}

// countLostLate counts holds whose Lost closed at or after Until: the
// holder was told too late to stop in time.
func countLostLate(holds []Hold) int {
	n := 0
	for _, h := range holds {
		if h.LostAt >= 0 && h.LostAt >= h.Until {
			n++
		}
	}
	return n
}

func countRejected(ops []registerOp) int {
	n := 0
	for _, op := range ops {
		if op.in.Write && !op.out.Unknown && !op.out.Accepted {
			n++
		}
	}
	return n
}

// stale is an accepted write that overwrote the value of a holder granted
// after the writer.
type stale struct {
	writer, overwritten  registerOp
	writerFrom, overFrom time.Duration
}

// findStale walks each register's accepted writes in the order they took
// effect — ascending fence, since the register accepts only rising fences —
// and flags a write whose predecessor came from a later grant. Writes that
// match no recorded hold cannot be placed and are reported in a note.
func findStale(holds []Hold, ops []registerOp) ([]stale, []string) {
	byKey := map[string][]registerOp{}
	var keys []string
	for _, op := range ops {
		if !op.in.Write || op.out.Unknown || !op.out.Accepted {
			continue
		}
		if _, seen := byKey[op.in.Key]; !seen {
			keys = append(keys, op.in.Key)
		}
		byKey[op.in.Key] = append(byKey[op.in.Key], op)
	}
	var found []stale
	unmatched := 0
	for _, key := range keys {
		writes := byKey[key]
		slices.SortStableFunc(writes, func(a, b registerOp) int { return cmp.Compare(a.in.Fence, b.in.Fence) })
		from := make([]time.Duration, len(writes))
		matched := make([]bool, len(writes))
		for i, w := range writes {
			from[i], matched[i] = grantOf(holds, w)
			if !matched[i] {
				unmatched++
			}
		}
		for i := 1; i < len(writes); i++ {
			if matched[i-1] && matched[i] && from[i-1] > from[i] {
				found = append(found, stale{writer: writes[i], overwritten: writes[i-1], writerFrom: from[i], overFrom: from[i-1]})
			}
		}
	}
	return found, staleNotes(found, unmatched)
}

func staleNotes(found []stale, unmatched int) []string {
	var notes []string
	for i, s := range found {
		if i == 5 {
			notes = append(notes, fmt.Sprintf("… and %d more stale writes", len(found)-5))
			break
		}
		notes = append(notes, fmt.Sprintf("stale write on %s: %s (fence %d, granted at %s) overwrote %s (fence %d, granted later at %s)",
			s.writer.in.Key, s.writer.in.Holder, s.writer.in.Fence, fmtMS(s.writerFrom),
			s.overwritten.in.Holder, s.overwritten.in.Fence, fmtMS(s.overFrom)))
	}
	if unmatched > 0 {
		notes = append(notes, fmt.Sprintf("%d accepted writes match no recorded hold (holder and fence); they were not checked for staleness", unmatched))
	}
	return notes
}

// grantOf returns when the hold a write was made under was granted: the
// hold with the write's holder and fence; if several match (as with fencing
// off), the latest granted before the write, else the earliest after it.
func grantOf(holds []Hold, op registerOp) (time.Duration, bool) {
	best, found := time.Duration(0), false
	for _, h := range holds {
		if h.Holder != op.in.Holder || h.Fence != op.in.Fence {
			continue
		}
		if !found || closerGrant(h.From, best, op.call) {
			best, found = h.From, true
		}
	}
	return best, found
}

// closerGrant reports whether a grant at cand explains a write at call
// better than one at cur.
func closerGrant(cand, cur, call time.Duration) bool {
	candBefore, curBefore := cand <= call, cur <= call
	if candBefore != curBefore {
		return candBefore
	}
	if candBefore {
		return cand > cur
	}
	return cand < cur
}

// porcupineHistory turns the recorded operations into porcupine's form. A
// write that failed returns at the end of the history: it may have taken
// effect at any point after its call, or never.
func porcupineHistory(ops []registerOp) []porcupine.Operation {
	holders := map[string]int{}
	var names []string
	var end time.Duration
	for _, op := range ops {
		if _, ok := holders[op.in.Holder]; !ok {
			holders[op.in.Holder] = 0
			names = append(names, op.in.Holder)
		}
		end = max(end, op.call, op.ret)
	}
	slices.Sort(names)
	for i, n := range names {
		holders[n] = i // porcupine's visualisation wants zero-based client ids
	}
	hist := make([]porcupine.Operation, 0, len(ops))
	for _, op := range ops {
		ret := op.ret
		if op.out.Unknown {
			ret = end + 1
		}
		hist = append(hist, porcupine.Operation{
			ClientId: holders[op.in.Holder],
			Input:    op.in,
			Call:     int64(op.call),
			Output:   op.out,
			Return:   int64(ret),
		})
	}
	return hist
}

// checkLinearizable runs porcupine on the register history. An empty
// history is trivially linearizable and has nothing to visualise.
func checkLinearizable(ops []registerOp, timeout time.Duration) (porcupine.CheckResult, *porcupine.LinearizationInfo) {
	return checkWith(registerModel(), ops, timeout)
}

func checkWith(model porcupine.Model, ops []registerOp, timeout time.Duration) (porcupine.CheckResult, *porcupine.LinearizationInfo) {
	if len(ops) == 0 {
		return porcupine.Ok, nil
	}
	outcome, info := porcupine.CheckOperationsVerbose(model, porcupineHistory(ops), timeout)
	return outcome, &info
}

func linearizability(c porcupine.CheckResult) string {
	switch c {
	case porcupine.Ok:
		return LinOK
	case porcupine.Illegal:
		return LinIllegal
	default:
		return LinUnknown
	}
}

// recordingNotes tells what the counts do not: how much was exercised and
// what could not be judged.
func recordingNotes(rec recording) []string {
	var notes []string
	if len(rec.holds) == 0 {
		notes = append(notes, "no grants: O2 and O5 checked nothing")
	}
	writes, unknown := 0, 0
	for _, op := range rec.ops {
		if op.in.Write {
			writes++
			if op.out.Unknown {
				unknown++
			}
		}
	}
	if writes == 0 {
		notes = append(notes, "no register writes: O1 checked nothing")
	}
	if unknown > 0 {
		notes = append(notes, fmt.Sprintf("%d register writes failed and may or may not have taken effect", unknown))
	}
	if s := failureSummary(rec.failures); s != "" {
		notes = append(notes, s)
	}
	return notes
}

// failureSummary names the most common failure, so a scenario that failed
// for an unexpected reason (say, a wrong address) does not hide behind a
// count.
func failureSummary(fs []failure) string {
	if len(fs) == 0 {
		return ""
	}
	counts := map[string]int{}
	holders := map[string]bool{}
	for _, f := range fs {
		counts[f.err]++
		holders[f.holder] = true
	}
	top, n := "", 0
	for msg, c := range counts {
		if c > n || (c == n && msg < top) {
			top, n = msg, c
		}
	}
	return fmt.Sprintf("%d failed lock attempts by %d holders, %d kinds; most common (%d×): %s", len(fs), len(holders), len(counts), n, top)
}

// ms formats a recorder time in milliseconds for notes and labels.
func fmtMS(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}
