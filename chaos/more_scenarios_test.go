package chaos

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
	"github.com/stretchr/testify/require"
)

// 10. Per-client partition: group X reaches nodes {0,1}, group Y reaches
// {2,3,4}; then they swap; then the network heals. At most one group can
// hold at a time (only one side has a majority), and both make progress
// once healed.
func TestScenario10PerClientPartition(t *testing.T) {
	run(t, scenario{name: "10 quorum: per-client partition, then swap, then heal", strategy: "quorum/5", faults: "X↔{0,1} Y↔{2,3,4}; swap; heal", fast: true},
		func(t *testing.T, rec *Recorder) facts {
			ctx := t.Context()
			ns, w, lockers := partitionSides(t, rec, "s10", false)

			end := fault(rec, "X↔{0,1} Y↔{2,3,4}")
			split(ns, false)
			w.RunAll(ctx, lockers, time.Second)
			end()
			rejoin(ns, false)
			end = fault(rec, "X↔{2,3,4} Y↔{0,1}")
			split(ns, true)
			w.RunAll(ctx, lockers, time.Second)
			end()
			rejoin(ns, true)
			healed, violations := progressAfterHealing(ctx, w, lockers, time.Second)
			return facts{strays: waitStrays(ctx, ns, partitionTTL), violations: violations,
				notes: []string{fmt.Sprintf("grants after healing: %v", healed)}}
		})
}

// 10f. Scenario 10 in fair mode (redlease.WithFairness), with the sides
// swapped under clients that are waiting in line: each side's entries are
// left on the nodes it no longer reaches (its give-up cannot remove them
// there), so after the swap the two sides' dead entries head the lines of
// all five nodes, and every live waiter is refused on at least three.
// Entries not refreshed expire (redlease.LineLifetime: 1 s here), so both
// sides make progress once healed: no node blocks every waiter for good.
// And at most one side holds at a time throughout.
func TestScenario10fPerClientPartitionFair(t *testing.T) {
	run(t, scenario{name: "10f quorum (fair): per-client partition swapped mid-wait, then heal", strategy: "quorum/5, fair", faults: "X↔{0,1} Y↔{2,3,4}; swap mid-wait; heal", fast: true},
		func(t *testing.T, rec *Recorder) facts {
			ctx := t.Context()
			ns, w, lockers := partitionSides(t, rec, "s10f", true)

			start := fault(rec, "X↔{0,1} Y↔{2,3,4}")
			split(ns, false)
			parted := make(chan map[string]int, 1)
			go func() { parted <- w.RunAll(ctx, lockers, 2*time.Second) }()
			sleep(ctx, time.Second)
			start()
			swap := fault(rec, "X↔{2,3,4} Y↔{0,1} (swapped mid-wait)")
			split(ns, true)
			rejoin(ns, false)
			before := <-parted
			swap()
			rejoin(ns, true)
			healed, violations := progressAfterHealing(ctx, w, lockers, 2*time.Second)
			return facts{strays: waitStrays(ctx, ns, partitionTTL), violations: violations,
				notes: []string{fmt.Sprintf("grants while parted: %v; after healing: %v", before, healed)}}
		})
}

// partitionTTL is the lock TTL of scenarios 10 and 10f.
const partitionTTL = 500 * time.Millisecond

// partitionSides starts scenarios 10 and 10f: five nodes, two sides X and
// Y of two holders each, each side with its own clients and Locker (in
// fair mode if fair), and a workload on key.
func partitionSides(t *testing.T, rec *Recorder, key string, fair bool) (*Nodes, *Workload, map[string]*redlease.Locker) {
	t.Helper()
	ns := StartNodes(t, 5, redistest.Config{})
	_, lx := quorumLockerFair(t, ns.Clients("x"), partitionTTL, fair)
	_, ly := quorumLockerFair(t, ns.Clients("y"), partitionTTL, fair)
	w := &Workload{Rec: rec, Reg: storage(t, rec, key), Key: key, Hold: 10 * time.Millisecond, Attempt: 150 * time.Millisecond}
	return ns, w, map[string]*redlease.Locker{"x1": lx, "x2": lx, "y1": ly, "y2": ly}
}

// split cuts side X and side Y off the nodes sides names; rejoin heals
// the same links.
func split(ns *Nodes, swapped bool) {
	x, y := sides(swapped)
	ns.Cut("x", x...)
	ns.Cut("y", y...)
}

func rejoin(ns *Nodes, swapped bool) {
	x, y := sides(swapped)
	ns.Heal("x", x...)
	ns.Heal("y", y...)
}

// sides returns the nodes side X and side Y are cut off from: X off
// {2,3,4} and Y off {0,1}, or the other way round when swapped.
func sides(swapped bool) (x, y []int) {
	if swapped {
		return []int{0, 1}, []int{2, 3, 4}
	}
	return []int{2, 3, 4}, []int{0, 1}
}

// progressAfterHealing runs the workload for d and reports its grants, and
// a violation unless both sides had one.
func progressAfterHealing(ctx context.Context, w *Workload, lockers map[string]*redlease.Locker, d time.Duration) (map[string]int, []string) {
	healed := w.RunAll(ctx, lockers, d)
	if healed["x1"]+healed["x2"] == 0 || healed["y1"]+healed["y2"] == 0 {
		return healed, []string{fmt.Sprintf("no liveness after healing: grants %v", healed)}
	}
	return healed, nil
}

// 11. Ambiguous replies: three nodes apply every request but their replies
// never arrive (a downstream-only timeout toxic). Acquisitions fail for
// want of a majority; the failure path must release on every node,
// including those whose reply was lost, so no key is left behind, and a
// later attempt is not fooled by its own earlier write.
func TestScenario11AmbiguousReplies(t *testing.T) {
	run(t, scenario{name: "11 quorum: replies lost, writes applied", strategy: "quorum/5", faults: "downstream timeout on 2,3,4", fast: true},
		func(t *testing.T, rec *Recorder) facts {
			ctx := t.Context()
			ns := StartNodes(t, 5, redistest.Config{})
			const ttl = 5 * time.Second // far longer than the scenario: a stray key would still be there
			_, la := quorumLocker(t, ns.Clients("a"), ttl)
			end := fault(rec, "replies from 2,3,4 lost")
			for _, i := range []int{2, 3, 4} {
				ns.Group("a")[i].SilenceReplies("ambiguous")
			}
			var violations []string
			for range 5 {
				if lk, err := la.TryLock(ctx, "s11"); err == nil {
					violations = append(violations, "granted without a majority's reply")
					_ = lk.Release(ctx)
				} else {
					rec.Failure("a", err)
				}
			}
			// The applied writes were undone: the keys are gone on the nodes
			// that never answered (checked directly, behind the proxies).
			sleep(ctx, 300*time.Millisecond) // the undos are sent through the silenced links, and applied
			strays := ns.StrayKeys(ctx, "chaos:*")
			ns.Heal("a", 2, 3, 4)
			end()
			w := &Workload{Rec: rec, Reg: storage(t, rec, "s11"), Key: "s11", Hold: 10 * time.Millisecond}
			after := w.RunAll(ctx, map[string]*redlease.Locker{"a": la}, 500*time.Millisecond)
			if after["a"] == 0 {
				violations = append(violations, "no grant after healing: an earlier ambiguous write still blocks the key")
			}
			return facts{strays: strays, violations: violations}
		})
}

// 12. A degraded link (latency with jitter, replies sliced into dribbles)
// between a watchdog-kept holder and every node. An extension counts only
// with a majority within validity; when renewals cannot keep up, the
// holder is told before Until, and a clean group takes over without
// overlap.
func TestScenario12WatchdogOnDegradedLinks(t *testing.T) {
	run(t, scenario{name: "12 quorum + watchdog: degraded links", strategy: "quorum/5 + watchdog", faults: "latency 60±50ms + slicer a→all", fast: false},
		func(t *testing.T, rec *Recorder) facts {
			ctx := t.Context()
			ns := StartNodes(t, 5, redistest.Config{})
			const ttl = 600 * time.Millisecond
			wd := watchdog(t)
			sa, _ := quorumLocker(t, ns.Clients("a"), ttl)
			la, err := redlease.New(sa, redlease.WithTTL(ttl), redlease.WithKeeper(wd), redlease.WithPrefix("chaos:"))
			require.NoError(t, err)
			_, lb := quorumLocker(t, ns.Clients("b"), ttl)
			reg := storage(t, rec, "s12")
			end := fault(rec, "a: latency+jitter+slicer")
			for _, p := range ns.Group("a") {
				p.Latency("lat", 60, 50)
				p.Slice("slice", 8, 2000)
			}
			stop := make(chan struct{})
			go func() { sleep(ctx, 3*time.Second); close(stop) }()
			done := make(chan struct{})
			go func() {
				defer close(done)
				for {
					select {
					case <-stop:
						return
					default:
					}
					granted, d := holdUntilLost(ctx, t, rec, reg, la, "a", "s12", 2*time.Second)
					select {
					case <-granted:
					case <-d:
						continue
					}
					<-d
				}
			}()
			wb := &Workload{Rec: rec, Reg: reg, Key: "s12", Hold: 20 * time.Millisecond}
			wb.Run(ctx, "b", lb, stop)
			<-done
			end()
			return facts{}
		})
}

// 13. A server's clock runs ahead: emulated by shrinking the TTL of the
// holder's key on some nodes (PEXPIRE), so it expires early there. On one
// node (a minority) nobody else can get a majority; on three (a majority)
// a second holder is granted — the documented hazard of Redlock's timing
// assumption — and fences keep the register linearizable.
func TestScenario13ServerClockJumps(t *testing.T) {
	for _, majority := range []bool{false, true} {
		t.Run(map[bool]string{false: "one node", true: "three nodes"}[majority], func(t *testing.T) {
			name := "13a quorum: clock jump on one node"
			exp := Expectation{}
			nodes := []int{0}
			if majority {
				name = "13b quorum: clock jump on a majority"
				exp = Expectation{AllowOverlap: true, Why: "server clocks outside the drift bound: outside Redlock's assumptions"}
				nodes = []int{0, 1, 2}
			}
			run(t, scenario{name: name, strategy: "quorum/5 (fenced)", faults: fmt.Sprintf("PEXPIRE 1ms on nodes %v", nodes), fast: true, exp: exp},
				func(t *testing.T, rec *Recorder) facts {
					ctx := t.Context()
					ns := StartNodes(t, 5, redistest.Config{})
					const ttl = 3 * time.Second
					_, la := quorumLocker(t, ns.Clients("a"), ttl)
					_, lb := quorumLocker(t, ns.Clients("b"), ttl)
					reg := storage(t, rec, "s13")
					a, err := la.TryLock(ctx, "s13")
					if err != nil {
						t.Fatal(err)
					}
					from := rec.Now()
					_, _ = reg.Write(ctx, "a", a.Fence(), 1)
					deadline := time.Now().Add(time.Second)
					for time.Now().Before(deadline) { // let the grant's last writes land
						n := 0
						for i := range ns.Servers {
							if v, _ := ns.Direct(i).Get(ctx, "chaos:s13").Result(); v == a.Token() {
								n++
							}
						}
						if n == len(ns.Servers) {
							break
						}
						time.Sleep(time.Millisecond)
					}
					end := fault(rec, "clock jump")
					for _, i := range nodes {
						ns.Direct(i).PExpire(ctx, "chaos:s13", time.Millisecond)
					}
					end()
					w := &Workload{Rec: rec, Reg: reg, Key: "s13", Hold: 30 * time.Millisecond, Attempt: 200 * time.Millisecond}
					stop := make(chan struct{})
					bDone := make(chan int, 1)
					go func() { bDone <- w.Run(ctx, "b", lb, stop) }()
					sleep(ctx, 500*time.Millisecond)
					// A still believes and writes again, as a slow holder would.
					_, _ = reg.Write(ctx, "a", a.Fence(), 2)
					aTo := rec.Now()
					_ = a.Release(ctx)
					rec.AddHold(Hold{Holder: "a", Fence: a.Fence(), From: from, To: min(aTo, rec.At(a.Until())), Until: rec.At(a.Until()), LostAt: NeverLost})
					close(stop)
					<-bDone
					return facts{}
				})
		})
	}
}

// rateClock is a client clock running at rate times real time, injected
// into the Locker and the strategy (redlease.Clock).
type rateClock struct {
	start time.Time
	rate  float64
}

func (c rateClock) Now() time.Time {
	return c.start.Add(time.Duration(float64(time.Since(c.start)) * c.rate))
}

// 14. A client whose clock runs at half speed, injected into its Locker and
// strategy: it believes its lock valid twice as long as it is. (Wall-clock
// steps need no scenario: the library reads time.Now, whose monotonic
// reading they do not move.) Another holder is granted the key once the
// nodes expire it — recorded, since the drift is outside the factor — and
// every write the slow holder makes after that is refused by the fence.
func TestScenario14SlowClientClock(t *testing.T) {
	run(t, scenario{name: "14 quorum: client clock at half speed (injected)", strategy: "quorum/5 (fenced)", faults: "client clock rate 0.5",
		exp: Expectation{AllowOverlap: true, Why: "client clock rate outside the drift factor: outside Redlock's assumptions"}},
		func(t *testing.T, rec *Recorder) facts {
			ctx := t.Context()
			ns := StartNodes(t, 5, redistest.Config{})
			const ttl = 600 * time.Millisecond
			slow := rateClock{start: time.Now(), rate: 0.5}
			sa, _ := quorumLocker(t, ns.Clients("a"), ttl, quorum.WithClock(slow))
			la, err := redlease.New(sa, redlease.WithTTL(ttl), redlease.WithPrefix("chaos:"), redlease.WithClock(slow))
			require.NoError(t, err)
			_, lb := quorumLocker(t, ns.Clients("b"), ttl)
			reg := storage(t, rec, "s14")
			a, err := la.TryLock(ctx, "s14")
			if err != nil {
				t.Fatal(err)
			}
			from := rec.Now()
			w := &Workload{Rec: rec, Reg: reg, Key: "s14", Hold: 30 * time.Millisecond}
			stop := make(chan struct{})
			bDone := make(chan int, 1)
			go func() { bDone <- w.Run(ctx, "b", lb, stop) }()
			// A writes while its own clock says the lock is valid: a careful
			// holder, fooled only by its clock.
			writes := 0
			for v := int64(1); a.Valid(); v++ {
				_, _ = reg.Write(ctx, "a", a.Fence(), v)
				writes++
				sleep(ctx, 50*time.Millisecond)
			}
			rec.AddHold(Hold{Holder: "a", Fence: a.Fence(), From: from, To: rec.Now(), Until: rec.Now(), LostAt: NeverLost})
			close(stop)
			<-bDone
			return facts{notes: []string{fmt.Sprintf("the slow holder believed for %v (TTL %v), wrote %d times", time.Duration(rec.Now()-from).Round(time.Millisecond), ttl, writes)}}
		})
}
