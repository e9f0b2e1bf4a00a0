package sim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scopeWorld is a World with only what scopes() reads: a scenario, a
// schedule and the nodes' records.
func scopeWorld(sc Scenario, faults []Fault) *World {
	return &World{sc: sc, faults: faults, start: time.Now(), hist: newHistory(time.Now(), false)}
}

func lockAt(key, token string, exp time.Time) snapKey { return snapKey{key: key, val: token, exp: exp} }

// gradeOne excuses and grades one violation of inv naming holds.
func gradeOne(w *World, inv string, at time.Duration, holds ...*Hold) (string, Violation) {
	vs := []Violation{{Inv: inv, At: at, Holds: holds}}
	excuse(vs, w.scopes(), w.votesByToken())
	return grade(vs), vs[0]
}

func TestScopeClockJump(t *testing.T) {
	exp := time.Now().Add(time.Second)
	w := scopeWorld(Scenario{Strategy: Quorum, Nodes: 3}, []Fault{
		{At: 100 * time.Millisecond, Kind: FaultClockJump, Node: 1, Amount: 50 * time.Millisecond, Outside: true},
	})
	w.scope.jumps = []jumpRec{{node: 1, at: 100 * time.Millisecond, data: []snapKey{lockAt("k0", "A.1", exp), lockAt("redlease:fence:{k0}", "7", time.Time{})}}}
	a := &Hold{Key: "k0", Token: "A.2"} // the same Lock call as A.1 on the node
	b := &Hold{Key: "k0", Token: "B.1"}
	c := &Hold{Key: "k0", Token: "C.1"}

	v, viol := gradeOne(w, InvOverlap, 150*time.Millisecond, a, b)
	assert.Equal(t, Hazard, v, "a's key was on the jumped node")
	assert.Equal(t, []int{0}, viol.Excused)
	assert.Equal(t, []string{FaultClockJump}, viol.Faults)

	v, _ = gradeOne(w, InvFenceOrder, 150*time.Millisecond, a, c)
	assert.Equal(t, Hazard, v, "a concurrent grant breaks fence order too")

	v, _ = gradeOne(w, InvOverlap, 150*time.Millisecond, b, c)
	assert.Equal(t, Fail, v, "neither lock was on the jumped node")

	v, _ = gradeOne(w, InvOverlap, 50*time.Millisecond, a, b)
	assert.Equal(t, Fail, v, "the jump came after the violation")

	v, _ = gradeOne(w, InvReleaseKept, 150*time.Millisecond, a)
	assert.Equal(t, Fail, v, "no fault excuses release-kept-valid")
}

func TestScopeClockSkewDownNode(t *testing.T) {
	exp := time.Now().Add(time.Second)
	w := scopeWorld(Scenario{Strategy: Quorum, Nodes: 3}, []Fault{
		{At: 100 * time.Millisecond, Kind: FaultClockSkew, Node: -1, Nodes: []int{0, 2}, Amount: 50 * time.Millisecond, Outside: true},
	})
	// Node 2 was down at the skew: what it had at its crash comes back
	// with TTLs shortened by the jump.
	w.scope.crashes = []crashRec{{node: 2, at: 80 * time.Millisecond, data: []snapKey{lockAt("k0", "D.1", exp)}}}
	w.scope.jumps = []jumpRec{{node: 0, at: 100 * time.Millisecond}, {node: 2, at: 100 * time.Millisecond, down: true}}
	v, _ := gradeOne(w, InvOverlap, 150*time.Millisecond, &Hold{Key: "k0", Token: "D.1"}, &Hold{Key: "k0", Token: "E.1"})
	assert.Equal(t, Hazard, v)
	v, _ = gradeOne(w, InvOverlap, 150*time.Millisecond, &Hold{Key: "k0", Token: "F.1"}, &Hold{Key: "k0", Token: "E.1"})
	assert.Equal(t, Fail, v)
}

func TestScopeRestartOutside(t *testing.T) {
	exp := time.Now().Add(time.Second)
	crash := 100 * time.Millisecond
	for _, mode := range []string{"empty", "snapshot"} {
		t.Run(mode, func(t *testing.T) {
			w := scopeWorld(Scenario{Strategy: Quorum, Nodes: 3, Fencing: true}, []Fault{
				{At: crash, Kind: FaultRestart, Node: 0, For: 10 * time.Millisecond, Mode: mode, Outside: true},
			})
			w.scope.crashes = []crashRec{{node: 0, at: crash,
				data: []snapKey{lockAt("k0", "A.1", exp), lockAt("k1", "K.1", exp), lockAt("redlease:fence:{k0}", "5", time.Time{}), lockAt("redlease:fence:{k1}", "3", time.Time{})},
				// The snapshot has K.1 as it was at the crash and k1's counter: only k0's lock and counter are lost in snapshot mode.
				snap: []snapKey{lockAt("k1", "K.1", exp), lockAt("redlease:fence:{k1}", "3", time.Time{})},
			}}
			w.scope.votes = []vote{
				{node: 0, key: "k0", token: "B.1", at: 120 * time.Millisecond}, // after the restart
				{node: 1, key: "k0", token: "C.1", at: 120 * time.Millisecond}, // another node
				{node: 0, key: "k0", token: "E.1", at: 90 * time.Millisecond},  // before the crash
				{node: 0, key: "k1", token: "G.1", at: 130 * time.Millisecond},
			}
			a, b, c, e, g, k := &Hold{Token: "A.1"}, &Hold{Token: "B.1"}, &Hold{Token: "C.1"}, &Hold{Token: "E.1"}, &Hold{Token: "G.1"}, &Hold{Token: "K.1"}

			v, _ := gradeOne(w, InvOverlap, 150*time.Millisecond, a, c)
			assert.Equal(t, Hazard, v, "a's key was lost")
			v, _ = gradeOne(w, InvOverlap, 150*time.Millisecond, b, c)
			assert.Equal(t, Fail, v, "a vote of the restarted node excuses fence order only")
			v, _ = gradeOne(w, InvFenceOrder, 150*time.Millisecond, e, b)
			assert.Equal(t, Hazard, v, "b got the vote of a node whose counter of k0 went back")
			v, _ = gradeOne(w, InvFenceOrder, 150*time.Millisecond, e, c)
			assert.Equal(t, Fail, v, "c had no vote of the restarted node")
			v, _ = gradeOne(w, InvStale, 150*time.Millisecond, c, b)
			assert.Equal(t, Hazard, v)
			v, _ = gradeOne(w, InvFenceOrder, 150*time.Millisecond, e, g)
			want := Hazard // k1's counter was lost too
			if mode == "snapshot" {
				want = Fail // the snapshot kept k1's counter
			}
			assert.Equal(t, want, v)
			v, _ = gradeOne(w, InvOverlap, 150*time.Millisecond, k, c)
			want = Hazard
			if mode == "snapshot" {
				want = Fail // the snapshot brought K.1 back as it was
			}
			assert.Equal(t, want, v)
		})
	}
}

func TestScopeRestartFencesOnly(t *testing.T) {
	exp := time.Now().Add(time.Second)
	w := scopeWorld(Scenario{Strategy: Quorum, Nodes: 5, Fencing: true, DelayedRestart: 400 * time.Millisecond}, []Fault{
		{At: 100 * time.Millisecond, Kind: FaultRestart, Node: 3, For: 10 * time.Millisecond, Mode: "empty", FenceOutside: true},
	})
	w.scope.crashes = []crashRec{{node: 3, at: 100 * time.Millisecond, data: []snapKey{lockAt("k0", "A.1", exp), lockAt("redlease:fence:{k0}", "5", time.Time{})}}}
	w.scope.votes = []vote{{node: 3, key: "k0", token: "B.1", at: 600 * time.Millisecond}}
	a, b := &Hold{Token: "A.1"}, &Hold{Token: "B.1"}
	v, _ := gradeOne(w, InvOverlap, 650*time.Millisecond, a, b)
	assert.Equal(t, Fail, v, "the delayed-restart rule keeps exclusion")
	v, _ = gradeOne(w, InvFenceOrder, 650*time.Millisecond, a, b)
	assert.Equal(t, Hazard, v)
}

func TestScopeStaleFailover(t *testing.T) {
	f := Fault{At: 500 * time.Millisecond, Kind: FaultFailover, Node: fPrimary, Mode: "switch+stale", Outside: true}
	w := scopeWorld(Scenario{Strategy: Failover, Nodes: 2, Sentinels: 3}, []Fault{f})
	w.scope.snaps = []snapRec{{node: fReplica, at: 400 * time.Millisecond}}
	w.scope.votes = []vote{
		{node: fPrimary, key: "k0", token: "A.1", at: 450 * time.Millisecond}, // after the snapshot: lost
		{node: fPrimary, key: "k1", token: "O.1", at: 100 * time.Millisecond}, // long over by the snapshot
		{node: fReplica, key: "k0", token: "B.1", at: 600 * time.Millisecond},
		{node: fReplica, key: "k1", token: "C.1", at: 600 * time.Millisecond},
	}
	a := &Hold{Token: "A.1", From: 451 * time.Millisecond, To: 550 * time.Millisecond}
	o := &Hold{Token: "O.1", From: 101 * time.Millisecond, To: 200 * time.Millisecond}
	b, c := &Hold{Token: "B.1"}, &Hold{Token: "C.1"}
	w.hist.holds = []*Hold{a, o, b, c}
	v, _ := gradeOne(w, InvOverlap, 600*time.Millisecond, a, b)
	assert.Equal(t, Hazard, v)
	v, _ = gradeOne(w, InvFenceOrder, 600*time.Millisecond, o, c)
	assert.Equal(t, Fail, v, "k1 was granted by nobody after the snapshot: its counter is intact")
	v, _ = gradeOne(w, InvFenceOrder, 700*time.Millisecond, &Hold{Token: "X.1"}, b)
	assert.Equal(t, Hazard, v, "k0's counter went back with the stale promotion")
}

func TestScopeOutsideKindWithoutScope(t *testing.T) {
	// An outside fault of a kind the scopes do not know excuses nothing.
	w := scopeWorld(Scenario{Strategy: Quorum, Nodes: 3}, []Fault{{At: 0, Kind: FaultPause, Node: 0, Outside: true}})
	v, _ := gradeOne(w, InvOverlap, time.Millisecond, &Hold{Token: "A.1"}, &Hold{Token: "B.1"})
	require.Equal(t, Fail, v)
}

// gradeState excuses and grades one state-valid violation of the lock
// with token, short on nodes and lacking short more holding nodes.
func gradeState(w *World, at time.Duration, token string, nodes []int, short int) (string, Violation) {
	vs := []Violation{{Inv: InvStateValid, At: at, Holds: []*Hold{{Token: token}}, Nodes: nodes, Short: short}}
	excuse(vs, w.scopes(), w.votesByToken())
	return grade(vs), vs[0]
}

func TestScopeStateValidNodes(t *testing.T) {
	exp := time.Now().Add(time.Second)
	w := scopeWorld(Scenario{Strategy: Quorum, Nodes: 5}, []Fault{
		{At: 100 * time.Millisecond, Kind: FaultClockJump, Node: 1, Amount: 50 * time.Millisecond, Outside: true},
		{At: 120 * time.Millisecond, Kind: FaultClockJump, Node: 2, Amount: 50 * time.Millisecond, Outside: true},
	})
	w.scope.jumps = []jumpRec{
		{node: 1, at: 100 * time.Millisecond, data: []snapKey{lockAt("k0", "A.1", exp)}},
		{node: 2, at: 120 * time.Millisecond, data: []snapKey{lockAt("k0", "A.1", exp)}},
	}
	v, viol := gradeState(w, 150*time.Millisecond, "A.2", []int{1, 3}, 1)
	assert.Equal(t, Hazard, v, "the jump cut A short on node 1, and one node was lacking")
	assert.Equal(t, []int{0}, viol.Excused)
	v, _ = gradeState(w, 150*time.Millisecond, "A.1", []int{0, 3}, 1)
	assert.Equal(t, Fail, v, "A was short on nodes no jump touched")
	v, _ = gradeState(w, 150*time.Millisecond, "A.1", []int{1, 3}, 2)
	assert.Equal(t, Fail, v, "node 3 fell short by itself, and A needed both")
	v, viol = gradeState(w, 150*time.Millisecond, "A.1", []int{1, 2}, 2)
	assert.Equal(t, Hazard, v, "the two jumps together")
	assert.Equal(t, []int{0, 1}, viol.Excused)
	v, _ = gradeState(w, 110*time.Millisecond, "A.1", []int{1, 2}, 2)
	assert.Equal(t, Fail, v, "node 2's jump came after the violation")
	v, _ = gradeState(w, 150*time.Millisecond, "B.1", []int{1, 2}, 2)
	assert.Equal(t, Fail, v, "B was on neither node at its jump")
}

func TestScopeStateValidRestart(t *testing.T) {
	// The single strategy's node restarted empty: the lock it lost is a
	// hazard, a lock it granted after it came back is not.
	exp := time.Now().Add(time.Second)
	w := scopeWorld(Scenario{Strategy: Single, Nodes: 1}, []Fault{
		{At: 100 * time.Millisecond, Kind: FaultRestart, Node: 0, For: 20 * time.Millisecond, Mode: "empty", Outside: true},
	})
	w.scope.crashes = []crashRec{{node: 0, at: 100 * time.Millisecond, data: []snapKey{lockAt("k0", "A.1", exp)}}}
	w.scope.votes = []vote{{node: 0, key: "k0", token: "B.1", at: 130 * time.Millisecond}}
	v, _ := gradeState(w, 120*time.Millisecond, "A.1", []int{0}, 1)
	assert.Equal(t, Hazard, v)
	v, _ = gradeState(w, 150*time.Millisecond, "B.1", []int{0}, 1)
	assert.Equal(t, Fail, v)
}

func TestScopeDriftOutside(t *testing.T) {
	exp := time.Now().Add(time.Second)
	f := Fault{At: 100 * time.Millisecond, For: 200 * time.Millisecond, Kind: FaultDrift, Node: 2, Client: -1, Rate: 0.5, Outside: true}
	r := Fault{At: 20 * time.Millisecond, For: 10 * time.Millisecond, Kind: FaultRestart, Node: 2, Mode: "empty"}
	late := Fault{At: 400 * time.Millisecond, For: 10 * time.Millisecond, Kind: FaultRestart, Node: 2, Mode: "empty"}
	w := scopeWorld(Scenario{Strategy: Quorum, Nodes: 3, DelayedRestart: 100 * time.Millisecond}, []Fault{r, f, late})
	w.scope.drifts = []jumpRec{{node: 2, at: 100 * time.Millisecond, data: []snapKey{lockAt("k0", "A.1", exp)}}}
	w.scope.crashes = []crashRec{
		{node: 2, at: 20 * time.Millisecond, data: []snapKey{lockAt("k0", "R.1", exp)}},  // its wait ran into the window
		{node: 2, at: 400 * time.Millisecond, data: []snapKey{lockAt("k0", "L.1", exp)}}, // after it
	}
	w.scope.votes = []vote{
		{node: 2, key: "k0", token: "B.1", at: 150 * time.Millisecond}, // granted on the fast clock
		{node: 2, key: "k0", token: "C.1", at: 300 * time.Millisecond}, // after the window
		{node: 1, key: "k0", token: "D.1", at: 150 * time.Millisecond}, // on another node
	}
	for _, tc := range []struct {
		token string
		want  string
	}{{"A.1", Hazard}, {"B.1", Hazard}, {"R.1", Hazard}, {"C.1", Fail}, {"D.1", Fail}, {"L.1", Fail}} {
		v, _ := gradeState(w, 320*time.Millisecond, tc.token, []int{2, 0}, 1)
		assert.Equal(t, tc.want, v, tc.token)
		v, _ = gradeOne(w, InvOverlap, 320*time.Millisecond, &Hold{Token: tc.token}, &Hold{Token: "X.1"})
		assert.Equal(t, tc.want, v, tc.token+" (overlap)")
	}
	v, _ := gradeState(w, 320*time.Millisecond, "A.1", []int{0, 1}, 1)
	assert.Equal(t, Fail, v, "A was short on nodes that ran at their rate")
	v, _ = gradeState(w, 90*time.Millisecond, "A.1", []int{2}, 1)
	assert.Equal(t, Fail, v, "before the window")

	// A client's clock slow beyond the factor: the locks it was granted
	// before the window's end, short on any node.
	cf := Fault{At: 100 * time.Millisecond, For: 100 * time.Millisecond, Kind: FaultDrift, Node: -1, Client: 1, Rate: 0.5, Outside: true}
	w = scopeWorld(Scenario{Strategy: Quorum, Nodes: 3}, []Fault{cf})
	w.scope.votes = []vote{
		{node: 0, client: 1, key: "k0", token: "E.1", at: 50 * time.Millisecond},
		{node: 0, client: 1, key: "k0", token: "F.1", at: 250 * time.Millisecond},
		{node: 0, client: 0, key: "k0", token: "G.1", at: 150 * time.Millisecond},
	}
	v, _ = gradeState(w, 150*time.Millisecond, "E.1", []int{0, 1}, 2)
	assert.Equal(t, Hazard, v)
	v, _ = gradeState(w, 260*time.Millisecond, "F.1", []int{0, 1}, 2)
	assert.Equal(t, Fail, v)
	v, _ = gradeState(w, 150*time.Millisecond, "G.1", []int{0, 1}, 2)
	assert.Equal(t, Fail, v)
}
