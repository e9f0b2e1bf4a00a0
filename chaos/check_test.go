package chaos

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// msec is n milliseconds, to keep the tables short.
func msec(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// mkHold is a hold from..to (ms) that was never lost, with Until at to.
func mkHold(holder string, fence uint64, from, to int) Hold {
	return Hold{Holder: holder, Fence: fence, From: msec(from), To: msec(to), Until: msec(to), LostAt: NeverLost}
}

// keyed is h on key.
func keyed(key string, h Hold) Hold {
	h.Key = key
	return h
}

// mkWrite is a completed write on key "k" of value fence (so states are
// easy to read), that saw the given outcome: the new state if accepted,
// else the refusing state at seenFence.
func mkWrite(holder string, fence uint64, call, ret int, accepted bool, seenFence uint64) registerOp {
	out := registerOutput{Accepted: accepted, Fence: seenFence, Value: int64(seenFence)}
	if accepted {
		out = registerOutput{Accepted: true, Fence: fence, Value: int64(fence)}
	}
	return registerOp{
		in:   registerInput{Key: "k", Holder: holder, Write: true, Fence: fence, Value: int64(fence)},
		out:  out,
		call: msec(call), ret: msec(ret),
	}
}

func mkRead(holder string, call, ret int, fence uint64) registerOp {
	return registerOp{
		in:   registerInput{Key: "k", Holder: holder},
		out:  registerOutput{Fence: fence, Value: int64(fence)},
		call: msec(call), ret: msec(ret),
	}
}

func TestFindOverlaps(t *testing.T) {
	for _, tc := range []struct {
		name  string
		holds []Hold
		want  int
	}{
		{"disjoint", []Hold{mkHold("a", 1, 0, 10), mkHold("b", 2, 20, 30)}, 0},
		{"touching [a,b) and [b,c) do not overlap", []Hold{mkHold("a", 1, 0, 10), mkHold("b", 2, 10, 20)}, 0},
		{"a holder's own re-grant is no overlap", []Hold{mkHold("a", 1, 0, 10), mkHold("a", 2, 5, 15)}, 0},
		{"two holders", []Hold{mkHold("a", 1, 0, 10), mkHold("b", 2, 5, 15)}, 1},
		{"input order does not matter", []Hold{mkHold("b", 2, 5, 15), mkHold("a", 1, 0, 10)}, 1},
		{"one long hold contains two", []Hold{mkHold("a", 1, 0, 100), mkHold("b", 2, 10, 20), mkHold("c", 3, 30, 40)}, 2},
		{"three at once are three pairs", []Hold{mkHold("a", 1, 0, 10), mkHold("b", 2, 1, 11), mkHold("c", 3, 2, 12)}, 3},
		{"empty and inverted holds overlap nothing", []Hold{mkHold("a", 1, 0, 10), mkHold("b", 2, 5, 5), mkHold("c", 3, 7, 3)}, 0},
		{"same start", []Hold{mkHold("a", 1, 5, 10), mkHold("b", 2, 5, 6)}, 1},
		{"holds of different keys do not overlap", []Hold{keyed("k1", mkHold("a", 1, 0, 10)), keyed("k2", mkHold("b", 1, 5, 15)), keyed("k1", mkHold("b", 2, 12, 20))}, 0},
		{"holds of one key among others", []Hold{keyed("k1", mkHold("a", 1, 0, 10)), keyed("k2", mkHold("b", 1, 5, 15)), keyed("k2", mkHold("a", 2, 12, 20))}, 1},
		{"none", nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Len(t, findOverlaps(tc.holds), tc.want)
		})
	}

	t.Run("the overlap is the intersection", func(t *testing.T) {
		holds := []Hold{mkHold("a", 1, 0, 10), mkHold("b", 2, 5, 15)}
		got := findOverlaps(holds)
		require.Len(t, got, 1)
		assert.Equal(t, msec(5), got[0].from)
		assert.Equal(t, msec(10), got[0].to)
		assert.ElementsMatch(t, []string{"a", "b"}, []string{holds[got[0].a].Holder, holds[got[0].b].Holder})
	})
}

func TestCountLostLate(t *testing.T) {
	lost := func(lostAt, until int) Hold {
		return Hold{Holder: "a", From: 0, To: msec(min(lostAt, until)), Until: msec(until), LostAt: msec(lostAt)}
	}
	holds := []Hold{
		mkHold("never lost", 1, 0, 10),
		lost(5, 10),  // in time
		lost(10, 10), // at Until: too late, the holder could not stop in time
		lost(12, 10), // after Until
		{Holder: "lost at 0", Until: msec(10), LostAt: 0},
	}
	assert.Equal(t, 2, countLostLate(holds))
}

func TestFindStale(t *testing.T) {
	t.Run("rising fences: a late holder is rejected, nothing stale", func(t *testing.T) {
		holds := []Hold{mkHold("a", 1, 0, 10), mkHold("b", 2, 10, 20)}
		ops := []registerOp{
			mkWrite("a", 1, 1, 2, true, 0),
			mkWrite("b", 2, 11, 12, true, 0),
			mkWrite("a", 1, 13, 14, false, 2), // a woke up late
		}
		stale, notes := findStale(holds, ops)
		assert.Empty(t, stale)
		assert.Empty(t, notes)
		assert.Equal(t, 1, countRejected(ops))
	})

	t.Run("fence anomaly: an earlier grant overwrites a later one", func(t *testing.T) {
		// b was granted after a but with a lower fence, so a's late write
		// goes through: exactly what fences exist to prevent.
		holds := []Hold{mkHold("a", 5, 0, 10), mkHold("b", 4, 10, 20)}
		ops := []registerOp{
			mkWrite("b", 4, 11, 12, true, 0),
			mkWrite("a", 5, 13, 14, true, 0),
		}
		stale, notes := findStale(holds, ops)
		require.Len(t, stale, 1)
		assert.Equal(t, "a", stale[0].writer.in.Holder)
		assert.Equal(t, "b", stale[0].overwritten.in.Holder)
		require.Len(t, notes, 1)
		assert.Contains(t, notes[0], "a (fence 5, granted at 0.0ms) overwrote b (fence 4, granted later at 10.0ms)")
	})

	t.Run("rejected and failed writes are not effects", func(t *testing.T) {
		holds := []Hold{mkHold("a", 5, 0, 10), mkHold("b", 4, 10, 20)}
		failed := mkWrite("b", 4, 11, 12, false, 0)
		failed.out = registerOutput{Unknown: true}
		ops := []registerOp{failed, mkWrite("a", 5, 13, 14, true, 0)}
		stale, _ := findStale(holds, ops)
		assert.Empty(t, stale)
	})

	t.Run("registers are judged apart", func(t *testing.T) {
		holds := []Hold{mkHold("a", 5, 0, 10), mkHold("b", 4, 10, 20)}
		other := mkWrite("b", 4, 11, 12, true, 0)
		other.in.Key = "other"
		stale, _ := findStale(holds, []registerOp{other, mkWrite("a", 5, 13, 14, true, 0)})
		assert.Empty(t, stale)
	})

	t.Run("a write without a hold is reported, not judged", func(t *testing.T) {
		holds := []Hold{mkHold("a", 1, 0, 10)}
		ops := []registerOp{mkWrite("a", 1, 1, 2, true, 0), mkWrite("ghost", 9, 3, 4, true, 0)}
		stale, notes := findStale(holds, ops)
		assert.Empty(t, stale)
		require.Len(t, notes, 1)
		assert.Contains(t, notes[0], "1 accepted writes match no recorded hold")
	})

	t.Run("with repeated fences the write's own grant is used", func(t *testing.T) {
		// Fencing off: every grant has fence 0, so only the write's time
		// tells which hold it belongs to.
		holds := []Hold{mkHold("a", 7, 0, 10), mkHold("a", 7, 30, 40)}
		assert.Equal(t, msec(30), must(grantOf(holds, mkWrite("a", 7, 35, 36, true, 0))))
		assert.Equal(t, msec(0), must(grantOf(holds, mkWrite("a", 7, 5, 6, true, 0))))
	})
}

func must(d time.Duration, ok bool) time.Duration {
	if !ok {
		return -1
	}
	return d
}

func TestVerdict(t *testing.T) {
	clean := Result{Linearizable: true, Linearizability: LinOK}
	with := func(f func(*Result)) Result {
		r := clean
		f(&r)
		return r
	}
	for _, tc := range []struct {
		name    string
		res     Result
		verdict string
		note    string
	}{
		{"clean", clean, VerdictPass, ""},
		{"overlap not allowed", with(func(r *Result) { r.Overlaps = 3 }), VerdictFail, "O2 violated: 3 overlaps"},
		{"overlap allowed", with(func(r *Result) {
			r.Overlaps = 3
			r.Expect = Expectation{AllowOverlap: true, Why: "failover before replication"}
		}),
			VerdictHazard, "O2 violated as documented: 3 overlaps"},
		{"allowed but absent is a pass", with(func(r *Result) { r.Expect = Expectation{AllowOverlap: true, AllowStrays: true} }), VerdictPass, ""},
		{"stale write fails even with everything allowed", with(func(r *Result) {
			r.StaleAccepted, r.Overlaps = 1, 1
			r.Expect = Expectation{AllowOverlap: true, AllowStrays: true, AllowLedgerLoss: true, AllowLostLate: true}
		}), VerdictFail, "O1 violated: 1 stale writes accepted"},
		{"not linearizable fails", with(func(r *Result) { r.Linearizable, r.Linearizability = false, LinIllegal }), VerdictFail, "not linearizable"},
		{"unknown linearizability fails", with(func(r *Result) { r.Linearizable, r.Linearizability = false, LinUnknown }), VerdictFail, "porcupine timed out"},
		{"strays allowed", with(func(r *Result) { r.StrayKeys = 2; r.Expect.AllowStrays = true }), VerdictHazard, "O3 violated as documented: 2 stray keys"},
		{"strays not allowed", with(func(r *Result) { r.StrayKeys = 2 }), VerdictFail, "O3 violated: 2 stray keys"},
		{"ledger loss", with(func(r *Result) { r.LedgerLost = 1 }), VerdictFail, "O4 violated: 1 acknowledged ledger entries lost"},
		{"ledger loss allowed", with(func(r *Result) { r.LedgerLost = 1; r.Expect.AllowLedgerLoss = true }), VerdictHazard, "O4 violated as documented"},
		{"lost late", with(func(r *Result) { r.LostLate = 1 }), VerdictFail, "O5 violated: 1 holds lost late"},
		{"lost late allowed", with(func(r *Result) { r.LostLate = 1; r.Expect.AllowLostLate = true }), VerdictHazard, "O5 violated as documented"},
		{"one allowed, one not", with(func(r *Result) { r.StrayKeys, r.LostLate = 1, 1; r.Expect.AllowStrays = true }), VerdictFail, "O5 violated: 1 holds lost late"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Judge(tc.res)
			assert.Equal(t, tc.verdict, got.Verdict)
			assert.Equal(t, tc.verdict == VerdictFail, got.Failed())
			if tc.note == "" {
				assert.Empty(t, got.Notes)
			} else {
				assert.Contains(t, strings.Join(got.Notes, "\n"), tc.note)
			}
		})
	}

	t.Run("a hazard says why", func(t *testing.T) {
		got := Judge(with(func(r *Result) {
			r.Overlaps = 1
			r.Expect = Expectation{AllowOverlap: true, Why: "single: failover before replication"}
		}))
		assert.Contains(t, got.Notes, "documented hazard: single: failover before replication")
	})

	t.Run("an unjudged result fails", func(t *testing.T) {
		assert.True(t, Result{}.Failed())
	})
}

func TestJudgeReplacesItsReasons(t *testing.T) {
	rec := NewRecorder("judge")
	rec.AddHold(mkHold("a", 1, 0, 10))
	res := rec.Check("single", "none", Expectation{})
	require.Equal(t, VerdictPass, res.Verdict)

	// The scenario counts strays after Check, adds a note of its own and
	// judges again.
	res.StrayKeys = 2
	res.Notes = append(res.Notes, "scenario note")
	res = Judge(res)
	assert.Equal(t, VerdictFail, res.Verdict)
	assert.Equal(t, "O3 violated: 2 stray keys", res.Notes[0])

	res.StrayKeys = 0
	res = Judge(Judge(res))
	assert.Equal(t, VerdictPass, res.Verdict)
	assert.NotContains(t, strings.Join(res.Notes, "\n"), "O3")
	assert.Equal(t, 1, strings.Count(strings.Join(res.Notes, "\n"), "scenario note"))
}

func TestCheck(t *testing.T) {
	rec := NewRecorder("synthetic")
	// b is granted while a still believes it holds (overlap), and with a
	// lower fence (anomaly), so a's late write overwrites b's.
	rec.AddHold(Hold{Holder: "a", Fence: 5, From: 0, To: msec(20), Until: msec(25), LostAt: msec(20)})
	rec.AddHold(Hold{Holder: "b", Fence: 4, From: msec(10), To: msec(30), Until: msec(30), LostAt: NeverLost})
	rec.AddHold(Hold{Holder: "c", Fence: 6, From: msec(30), To: msec(40), Until: msec(40), LostAt: msec(41)})
	rec.addOp(mkWrite("b", 4, 11, 12, true, 0))
	rec.addOp(mkWrite("a", 5, 13, 14, true, 0))
	rec.addOp(mkWrite("c", 6, 31, 32, true, 0))
	rec.addOp(mkWrite("a", 5, 33, 34, false, 6))
	rec.addOp(mkRead("c", 35, 36, 6))
	rec.AddFault(Fault{Name: "pause", From: msec(5), To: msec(15)})
	rec.Failure("c", assert.AnError)
	rec.Failure("c", assert.AnError)

	res := rec.Check("single", "pause", Expectation{AllowOverlap: true, Why: "pause beyond the TTL"})
	assert.Equal(t, "synthetic", res.Scenario)
	assert.Equal(t, 3, res.Grants)
	assert.Equal(t, 2, res.Failures)
	assert.Equal(t, 1, res.Overlaps)
	assert.Equal(t, 1, res.StaleAccepted)
	assert.Equal(t, 1, res.StaleRejected)
	assert.Equal(t, 1, res.LostLate)
	assert.True(t, res.Linearizable, res.Notes)
	assert.Equal(t, LinOK, res.Linearizability)
	assert.Equal(t, VerdictFail, res.Verdict) // the stale write, not the allowed overlap
	notes := strings.Join(res.Notes, "\n")
	assert.Contains(t, notes, "O1 violated: 1 stale writes accepted")
	assert.Contains(t, notes, "O2 violated as documented: 1 overlaps")
	assert.Contains(t, notes, "O5 violated: 1 holds lost late")
	assert.Contains(t, notes, "2 failed lock attempts by 1 holders, 1 kinds; most common (2×): "+assert.AnError.Error())
}

func TestCheckEmpty(t *testing.T) {
	res := NewRecorder("empty").Check("quorum", "none", Expectation{})
	assert.Equal(t, VerdictPass, res.Verdict)
	assert.True(t, res.Linearizable)
	assert.Contains(t, res.Notes, "no grants: O2 and O5 checked nothing")
	assert.Contains(t, res.Notes, "no register writes: O1 checked nothing")
}

// TestRegisterModel checks the porcupine model on hand-made histories, both
// ways: the checker must accept what a fenced register can do and reject
// what it cannot.
func TestRegisterModel(t *testing.T) {
	unknown := func(holder string, fence uint64, call int) registerOp {
		op := mkWrite(holder, fence, call, call+1, false, 0)
		op.out, op.err = registerOutput{Unknown: true}, assert.AnError
		return op
	}
	for _, tc := range []struct {
		name string
		ops  []registerOp
		want string
	}{
		{"sequential", []registerOp{
			mkWrite("a", 1, 0, 1, true, 0), mkWrite("b", 3, 2, 3, true, 0), mkWrite("a", 2, 4, 5, false, 3), mkRead("c", 6, 7, 3),
		}, LinOK},
		{"fence 0 is refused by a fresh register", []registerOp{mkWrite("a", 0, 0, 1, false, 0)}, LinOK},
		{"fence 0 accepted is impossible", []registerOp{mkWrite("a", 0, 0, 1, true, 0)}, LinIllegal},
		{"stale read after a completed write", []registerOp{
			mkWrite("a", 1, 0, 1, true, 0), mkWrite("b", 2, 2, 3, true, 0), mkRead("c", 4, 5, 1),
		}, LinIllegal},
		{"lower fence accepted after a completed higher one", []registerOp{
			mkWrite("a", 2, 0, 1, true, 0), mkWrite("b", 1, 2, 3, true, 0),
		}, LinIllegal},
		{"concurrent writes may take effect in either order", []registerOp{
			mkWrite("a", 2, 0, 10, true, 0), mkWrite("b", 1, 1, 9, true, 0),
		}, LinOK},
		{"a rejection must report the refusing state", []registerOp{
			mkWrite("a", 5, 0, 1, true, 0), mkWrite("b", 3, 2, 3, false, 4),
		}, LinIllegal},
		{"a failed write may have taken effect", []registerOp{unknown("a", 3, 0), mkRead("b", 5, 6, 3)}, LinOK},
		{"a failed write may never have taken effect", []registerOp{unknown("a", 3, 0), mkRead("b", 5, 6, 0)}, LinOK},
		{"but not both", []registerOp{unknown("a", 3, 0), mkRead("b", 5, 6, 3), mkRead("b", 7, 8, 0)}, LinIllegal},
		{"nor before its call", []registerOp{mkRead("b", 0, 1, 3), unknown("a", 3, 2)}, LinIllegal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := checkLinearizable(tc.ops, 5*time.Second)
			assert.Equal(t, tc.want, linearizability(got))
		})
	}
}

func TestSlug(t *testing.T) {
	for in, want := range map[[2]string]string{
		{"01 Quorum: kill minority", "quorum"}: "01-quorum-kill-minority-quorum",
		{"Failover/WAIT", ""}:                  "failover-wait",
		{"  ", "--"}:                           "scenario",
		{"é<x>", "single"}:                     "x-single",
	} {
		assert.Equal(t, want, Result{Scenario: in[0], Strategy: in[1]}.Slug(), in)
	}
}
