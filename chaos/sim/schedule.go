package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Fault kinds, as they appear in schedules and in hazard counts.
const (
	FaultDelay     = "delay"      // a node's links slow down (replies delayed past the next attempt)
	FaultLoss      = "loss"       // a node's links lose requests (before apply) and replies (after apply)
	FaultPartition = "partition"  // a client loses every message to and from some nodes
	FaultCut       = "cut"        // a node's connections are cut
	FaultPause     = "pause"      // a node serves nothing, then everything it queued
	FaultRestart   = "restart"    // a node crashes and restarts (empty, from a snapshot, or durable)
	FaultClockJump = "clock-jump" // a node's clock jumps forward
	FaultClockSkew = "clock-skew" // a majority of nodes' clocks jump forward together
	FaultBlink     = "blink"      // the idempotency store is unreachable for a moment
	FaultBlackhole = "blackhole"  // every message to and from a node is lost (connections stay open)
	// FaultBadKey: a lock key is overwritten with a hash on one or more
	// nodes (GET answers WRONGTYPE); the hash lives as long as the lock
	// it replaced would have, plus For (watchdog-mixed).
	FaultBadKey = "badkey"
	// FaultErrNode: a node answers every EVAL and EVALSHA with a fast
	// error (Mode: NOPERM or BUSY) for For (watchdog-mixed).
	FaultErrNode = "errnode"
)

// errReplies are the error replies of an errnode fault, by Mode. READONLY
// and LOADING are left out: go-redis retries them itself (MaxRetries)
// with a backoff jittered from math/rand, which no seed controls.
var errReplies = map[string]string{
	"NOPERM": "NOPERM User default has no permissions to run the 'evalsha' command",
	"BUSY":   "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
}

// Fault is one entry of a seed's schedule. Outside marks faults that lie
// outside the strategy's documented assumptions: violations in a run that
// had one are hazards, not failures.
type Fault struct {
	At      time.Duration // from the start of the run
	Kind    string
	Node    int           // -1: not node-specific
	Nodes   []int         // partition, clock-skew
	Client  int           // partition, cut: -1 for all clients
	For     time.Duration // window length (delay, loss, partition, pause, restart downtime)
	Amount  time.Duration // delay: extra delay bound; clock jumps: size
	Prob    float64       // loss probability per message
	Mode    string        // restart: "empty", "snapshot", "durable"; errnode: the error
	Key     string        // badkey: the lock key overwritten
	Outside bool
	// FenceOutside marks faults outside the assumptions of fence order
	// only (a node that lost its counters under the delayed-restart rule:
	// mutual exclusion holds, fence order is not promised).
	FenceOutside bool
	Why          string // for Outside or FenceOutside: which assumption it breaks
	// Rate: clock-drift, the clock's rate excess (drift.go).
	Rate float64
	// Slots: reshard, the slot range [lo, hi] it moves (reshard.go).
	Slots [2]int
}

func (f Fault) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%8.3fms %-10s", float64(f.At)/float64(time.Millisecond), f.Kind)
	if f.Node >= 0 {
		fmt.Fprintf(&b, " node=%d", f.Node)
	}
	if len(f.Nodes) > 0 {
		fmt.Fprintf(&b, " nodes=%v", f.Nodes)
	}
	if f.Key != "" {
		fmt.Fprintf(&b, " key=%s", f.Key)
	}
	if f.Client >= 0 && (f.Kind == FaultPartition || f.Kind == FaultCut || f.Kind == FaultDrift || f.Kind == FaultLateJoin) {
		fmt.Fprintf(&b, " client=%d", f.Client)
	}
	if f.For > 0 {
		fmt.Fprintf(&b, " for=%v", f.For)
	}
	if f.Amount != 0 {
		fmt.Fprintf(&b, " amount=%v", f.Amount)
	}
	if f.Prob > 0 {
		fmt.Fprintf(&b, " p=%.2f", f.Prob)
	}
	if f.Mode != "" {
		fmt.Fprintf(&b, " mode=%s", f.Mode)
	}
	if f.Rate != 0 {
		fmt.Fprintf(&b, " rate=%+.3f%%", 100*f.Rate)
	}
	if f.Slots != [2]int{} {
		fmt.Fprintf(&b, " slots=%d-%d", f.Slots[0], f.Slots[1])
	}
	switch {
	case f.Outside:
		fmt.Fprintf(&b, " OUTSIDE(%s)", f.Why)
	case f.FenceOutside:
		fmt.Fprintf(&b, " OUTSIDE-FENCES(%s)", f.Why)
	}
	return b.String()
}

// makeSchedule draws a seed's faults. It depends only on the seed and the
// scenario, never on how the run goes: same seed, same schedule.
func makeSchedule(seed uint64, sc *Scenario, horizon time.Duration) []Fault {
	r := rand.New(rand.NewPCG(seed, 0xfa017))
	if !sc.Faults {
		return nil
	}
	if sc.Schedule != nil {
		return sc.Schedule(r, sc, horizon)
	}
	n := sc.faultNodes()
	var fs []Fault
	count := 1 + r.IntN(5)
	for range count {
		f := Fault{At: time.Duration(r.Int64N(int64(horizon * 3 / 4))), Node: r.IntN(n), Client: -1}
		k := r.IntN(100)
		for try := 0; len(sc.Kinds) > 0 && !slices.Contains(sc.Kinds, kindOf(k)) && try < 64; try++ {
			k = r.IntN(100)
		}
		if len(sc.Kinds) > 0 && !slices.Contains(sc.Kinds, kindOf(k)) {
			continue
		}
		switch {
		case k < 18:
			f.Kind, f.For, f.Amount = FaultDelay, ms(r, 20, 300), ms(r, 5, 150)
		case k < 34:
			f.Kind, f.For, f.Prob = FaultLoss, ms(r, 20, 300), 0.1+0.5*r.Float64()
		case k < 46:
			f.Kind, f.For, f.Client = FaultPartition, ms(r, 20, 300), r.IntN(sc.Clients)
			f.Node = -1
			f.Nodes = pick(r, n, 1+r.IntN(max(1, n/2+1)))
		case k < 58:
			f.Kind = FaultCut
			if r.IntN(2) == 0 {
				f.Client = r.IntN(sc.Clients)
			}
		case k < 76:
			f.Kind, f.For = FaultPause, ms(r, 5, 250)
		case k < 90:
			if !sc.restartable() {
				continue
			}
			f.Kind, f.For = FaultRestart, ms(r, 0, 100)
			f.Mode = []string{"empty", "snapshot", "durable"}[r.IntN(3)]
			if len(sc.RestartModes) > 0 {
				f.Mode = sc.RestartModes[r.IntN(len(sc.RestartModes))]
			}
			f.Outside, f.FenceOutside, f.Why = sc.restartOutside(f.Mode)
		case k < 96:
			f.Kind, f.Amount = FaultClockJump, ms(r, 5, 400)
			f.Outside, f.Why = true, "a node's clock ran faster than the drift factor allows"
		default:
			if n < 3 {
				continue
			}
			f.Kind, f.Amount, f.Node = FaultClockSkew, ms(r, 20, 400), -1
			f.Nodes = pick(r, n, n/2+1)
			f.Outside, f.Why = true, "a majority's clocks jumped"
		}
		fs = append(fs, f)
	}
	if slices.Contains(sc.Kinds, FaultBlackhole) {
		for range r.IntN(3) {
			fs = append(fs, Fault{At: time.Duration(r.Int64N(int64(horizon * 3 / 4))), Kind: FaultBlackhole, Node: r.IntN(n), Client: -1, For: ms(r, 20, 400)})
		}
	}
	if sc.Barrier && r.IntN(2) == 0 {
		fs = append(fs, Fault{At: time.Duration(r.Int64N(int64(horizon / 2))), Kind: FaultBlink, Node: sc.storeNode(), Client: -1, For: ms(r, 5, 150)})
	}
	// Drawn last, so that the faults above are the ones the same seed drew
	// before these kinds existed.
	if slices.Contains(sc.Kinds, FaultBadKey) && sc.Watchdog {
		for range r.IntN(3) {
			f := Fault{At: time.Duration(r.Int64N(int64(horizon * 3 / 4))), Kind: FaultBadKey, Node: -1, Client: -1, For: ms(r, 20, 400)}
			if r.IntN(2) == 0 {
				f.Key = fmt.Sprintf("q%d", r.IntN(sc.Keys))
				f.Nodes = pick(r, sc.Nodes, 1+r.IntN(sc.Nodes))
			} else {
				f.Key = fmt.Sprintf("s%d", r.IntN(sc.Keys))
				f.Nodes = []int{sc.Nodes}
			}
			fs = append(fs, f)
		}
	}
	if slices.Contains(sc.Kinds, FaultErrNode) {
		for range r.IntN(3) {
			fs = append(fs, Fault{At: time.Duration(r.Int64N(int64(horizon * 3 / 4))), Kind: FaultErrNode, Node: r.IntN(n), Client: -1, For: ms(r, 50, 600), Mode: []string{"NOPERM", "BUSY"}[r.IntN(2)]})
		}
	}
	if sc.Cluster {
		fs = append(fs, clusterFaults(r, sc, horizon)...)
	}
	if sc.Strategy == Failover {
		ff := makeFailoverFaults(r, sc, horizon)
		// A restart close to the failover (or its failback) would make
		// another one of it.
		fs = slices.DeleteFunc(fs, func(f Fault) bool {
			return f.Kind == FaultRestart && f.At+f.For > ff[0].At-150*time.Millisecond && f.At < failoverEnd(ff)+100*time.Millisecond
		})
		fs = append(fs, ff...)
	}
	slices.SortStableFunc(fs, func(a, b Fault) int { return int(a.At - b.At) })
	return fs
}

// clusterFaults draws one to three faults on one master of the Cluster
// (the same one: the sick shard), each a pause, a black hole, an errnode
// or a badkey of the lock key that master serves.
func clusterFaults(r *rand.Rand, sc *Scenario, horizon time.Duration) []Fault {
	m := r.IntN(ClusterMasters)
	node := sc.clusterBase() + m
	var fs []Fault
	for range 1 + r.IntN(3) {
		f := Fault{At: time.Duration(r.Int64N(int64(horizon * 3 / 4))), Node: node, Client: -1}
		switch r.IntN(4) {
		case 0:
			f.Kind, f.For = FaultPause, ms(r, 5, 250)
		case 1:
			f.Kind, f.For = FaultBlackhole, ms(r, 20, 400)
		case 2:
			f.Kind, f.For, f.Mode = FaultErrNode, ms(r, 50, 600), []string{"NOPERM", "BUSY"}[r.IntN(2)]
		default:
			f.Kind, f.For, f.Node = FaultBadKey, ms(r, 20, 400), -1
			f.Key, f.Nodes = clusterKeys[m], []int{node}
		}
		fs = append(fs, f)
	}
	return fs
}

// kindOf is the fault kind makeSchedule's draw k (0–99) stands for.
func kindOf(k int) string {
	switch {
	case k < 18:
		return FaultDelay
	case k < 34:
		return FaultLoss
	case k < 46:
		return FaultPartition
	case k < 58:
		return FaultCut
	case k < 76:
		return FaultPause
	case k < 90:
		return FaultRestart
	case k < 96:
		return FaultClockJump
	default:
		return FaultClockSkew
	}
}

// ms draws a duration in [lo, hi] milliseconds, with microsecond grain.
func ms(r *rand.Rand, lo, hi int) time.Duration {
	return time.Duration(lo)*time.Millisecond + time.Duration(r.Int64N(int64(hi-lo)*1000+1))*time.Microsecond
}

// offGrid moves d by 1-999 ns either way, drawn from r. A caller's ctx
// drawn by ms (a microsecond grid) and started with a lock would
// otherwise end exactly at one of that lock's renewals whenever d is a
// multiple of the renewal period (TTLs are whole milliseconds), and
// which of the two goroutines the one instant wakes went first (a
// renewal or the release the ctx's end starts) would follow the Go
// scheduler, not the seed.
func offGrid(r *rand.Rand, d time.Duration) time.Duration {
	x := time.Duration(r.Int64N(1998)) - 999
	if x >= 0 {
		x++
	}
	return d + x
}

// keeperFraction is the renewal fraction (renew.WithFraction) of client
// ci's renew.Watchdog in the idempotency workloads: a third, moved by
// 4e-7 to 5e-6 either way, drawn from the seed (not from the client's
// stream, whose draws it leaves as they were). With a third exactly, the
// engine takes a lock first at Until less its TTL plus three quarters of
// an interval, then every three quarters of an interval: its fourth
// renewal falls on the lock's first Until, the instant the Barrier's
// claim, bounded by that Until, is abandoned (idem-quorum 3 and 6), and
// which of those two library timers went first would be the Go
// scheduler's.
// Moved, the fourth renewal comes 3·TTL·ε off that Until (18 ns to 0.9 µs
// at leases of 15-60 ms), before it or after it as the seed says.
func (w *World) keeperFraction(ci int) float64 {
	h := mix(mix(w.seed, 0xf4ac), uint64(ci))
	eps := 4e-7 + unit(h)*(5e-6-4e-7)
	if h&1 == 0 {
		eps = -eps
	}
	return 1.0/3 + eps
}

// pick draws k distinct node indexes of n, sorted.
func pick(r *rand.Rand, n, k int) []int {
	p := r.Perm(n)[:min(k, n)]
	slices.Sort(p)
	return p
}
