package chaos

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
)

// 21. Resharding mid-hold, for single (3 masters) and failover (3 masters,
// a replica each). A holds 200 locks, kept by a watchdog with a 3 s TTL
// (renewed about every second); 56 of them lie in three adjacent slots of
// the first master (12 plain keys in each, and 20 keys of one hash tag in
// the middle one), the other 144 anywhere outside them. B, on its own
// Cluster client, tries all 200 keys one after another the whole time.
// The three slots then move to the second master as redis-cli --cluster
// reshard moves them, one slot after another: CLUSTER SETSLOT IMPORTING
// on the target, MIGRATING on the source, the slot's keys moved in
// batches of 6 (CLUSTER GETKEYSINSLOT, MIGRATE … KEYS), then CLUSTER
// SETSLOT NODE on the target, the source and the third master. After each
// batch the migration waits until every lock of the slot has either been
// renewed by a call that began after the batch, or is lost: so each
// half-migrated state (keys of the slot on both masters) meets at least
// one renewal, and a renewal that cannot pass it costs the lock before the
// migration moves on.
//
// Required: no lock of A lost, each still valid at the end, renewed past
// its Until at the start and once more after the last slot was handed
// over; no grant to B while A holds (O2); after A releases, B takes every
// key with a fence above A's (fences moved with their slots). The attack
// must have run: the scenario fails (FAIL) when no renewal of a key
// already moved, or none of a key not yet moved, completed while its slot
// was half migrated, or when a slot's keys did not all reach the target.
func TestScenario21ClusterReshardingMidHold(t *testing.T) {
	for _, strategy := range []string{"single", "failover"} {
		t.Run(strategy, func(t *testing.T) {
			shape := map[string]string{"single": "single + Cluster (3 masters)", "failover": "failover + Cluster (3 masters, 3 replicas)"}[strategy]
			run(t, scenario{name: "21 " + strategy + ": Cluster resharding mid-hold", strategy: shape,
				faults: "3 slots resharded (SETSLOT IMPORTING/MIGRATING, MIGRATE in batches of 6, SETSLOT NODE) under 200 kept locks"},
				func(t *testing.T, rec *Recorder) facts { return reshardingMidHold(t, rec, strategy) })
		})
	}
}

// reshard21 is scenario 21's shape.
const (
	s21Locks        = 200
	s21PlainPerSlot = 12 // plain keys in each migrated slot
	s21Tagged       = 20 // keys of one hash tag, in the middle slot
	s21Batch        = 6  // keys per MIGRATE
	s21TTL          = 3 * time.Second
)

func reshardingMidHold(t *testing.T, rec *Recorder, strategy string) facts {
	ctx := t.Context()
	replicas := map[string]int{"single": 0, "failover": 1}[strategy]
	cl := redistest.StartClusterWithReplicas(t, 3, replicas)
	ca, cb := cl.Client(), cl.Client()
	src, dst := cl.Masters[0], cl.Masters[1]
	slots, keys, tag := s21Keys(ctx, t, ca, src)
	regs := redistest.Start(t, redistest.Config{}).Client()
	w := watchdog(t)
	locker := func(c *redis.ClusterClient, opts ...redlease.Option) *redlease.Locker {
		if strategy == "failover" {
			return clusterFailoverLocker(t, c, s21TTL, opts...)
		}
		return sentinelLocker(t, c, s21TTL, opts...)
	}
	la, lb := locker(ca, redlease.WithKeeper(w)), locker(cb)
	probe := redistest.StartStallProbe(t)
	var violations []string

	a := holdAll(ctx, t, rec, probe, regs, la, w, keys)
	defer a.stop()
	drift := a.drift(s21TTL)
	untilAtStart := a.untils()
	bc := contend(ctx, rec, regs, lb, keys)
	defer bc.stop()

	inSlot := map[int][]string{} // A's keys by migrated slot
	for _, k := range keys {
		if sl := lockSlot(k); slices.Contains(slots, sl) {
			inSlot[sl] = append(inSlot[sl], k)
		}
	}
	askingBefore := commandCalls(ctx, t, dst, "asking")
	var (
		st     reshardStats
		soft   = &redistest.SoftTB{TB: t}
		moved  = map[string]bool{} // lock keys (as A gave them) already on dst
		endMig = fault(rec, fmt.Sprintf("slots %d-%d resharded from %s to %s", slots[0], slots[len(slots)-1], src.Addr, dst.Addr))
	)
	migStart := time.Now()
	for _, sl := range slots {
		slotStart := time.Now()
		err := migrateSlot(ctx, cl.Masters, src, dst, sl, s21Batch, func(batch []string) {
			for _, k := range batch {
				if name, ok := strings.CutPrefix(k, "chaos:"); ok {
					moved[name] = true
				}
			}
			st.batches++
			after := time.Now()
			mine := inSlot[sl]
			nMoved := 0
			for _, k := range mine {
				if moved[k] {
					nMoved++
				}
			}
			split := nMoved > 0 && nMoved < len(mine)
			if split {
				st.splitStates++
			}
			// Until every lock of the slot was renewed by a call that began
			// after the batch (its Until then lies more than ttl less the
			// drift allowance past the batch), or is lost.
			renewedSince := func(k string) bool { return a.lock(k).Until().Sub(after) > s21TTL-drift }
			probe.WaitFor(soft, s21TTL, 3, 5*time.Millisecond, func() bool {
				for _, k := range mine {
					if a.lock(k).Valid() && !renewedSince(k) {
						return false
					}
				}
				return true
			}, "every lock of slot %d renewed or lost after a batch", sl)
			st.waited += time.Since(after)
			for _, k := range mine {
				switch {
				case !renewedSince(k):
				case moved[k]:
					st.renewedMoved++
				default:
					st.renewedStayed++
				}
				if split && renewedSince(k) {
					st.renewedSplit++
				}
			}
		})
		if err != nil {
			t.Fatalf("slot %d: %v", sl, err)
		}
		st.slotTimes = append(st.slotTimes, time.Since(slotStart))
	}
	migrated := time.Now()
	endMig()
	if soft.Failed() != "" {
		violations = append(violations, "a wait for renewals during the migration ran out (neither renewed nor lost): "+soft.Failed())
	}
	askingDuring := commandCalls(ctx, t, dst, "asking") - askingBefore

	// Every key of the slots on dst now, none left on src.
	for _, sl := range slots {
		if n, err := src.Client().ClusterCountKeysInSlot(ctx, sl).Result(); err != nil || n != 0 {
			violations = append(violations, fmt.Sprintf("slot %d: %d keys left on the source %s (%v)", sl, n, src.Addr, err))
		}
		if n, err := dst.Client().ClusterCountKeysInSlot(ctx, sl).Result(); err != nil || n == 0 {
			violations = append(violations, fmt.Sprintf("slot %d: no key on the target %s (%v)", sl, dst.Addr, err))
		}
	}
	// One renewal more after the hand-over, on the new owner (MOVED).
	soft = &redistest.SoftTB{TB: t}
	probe.WaitFor(soft, s21TTL, 3, 5*time.Millisecond, func() bool {
		for _, k := range keys {
			if lk := a.lock(k); lk.Valid() && lk.Until().Sub(migrated) <= s21TTL-drift {
				return false
			}
		}
		return true
	}, "every lock renewed after the last slot was handed over")
	var lost, lostMigrated, notPast []string
	for _, k := range keys {
		lk := a.lock(k)
		if !lk.Valid() {
			lost = append(lost, k)
			if slices.Contains(slots, lockSlot(k)) {
				lostMigrated = append(lostMigrated, k)
			}
			continue
		}
		if !lk.Until().After(untilAtStart[k]) {
			notPast = append(notPast, k)
		}
	}
	if len(lost) > 0 {
		violations = append(violations, fmt.Sprintf("A lost %d of %d locks (%d of them in the migrated slots; first: %s: %v)",
			len(lost), len(keys), len(lostMigrated), lost[0], a.lock(lost[0]).Err()))
	}
	if len(notPast) > 0 {
		violations = append(violations, fmt.Sprintf("%d locks valid but not renewed past their Until at the start (first %s)", len(notPast), notPast[0]))
	}
	if soft.Failed() != "" && len(lost) == 0 {
		violations = append(violations, "not every lock was renewed after the hand-over: "+soft.Failed())
	}
	if st.renewedMoved == 0 || st.renewedStayed == 0 {
		violations = append(violations, fmt.Sprintf("no renewal of a key already moved (%d) or of one not yet moved (%d) completed while its slot was half migrated (%d batches, %d of them left a slot's locks split between the masters)", st.renewedMoved, st.renewedStayed, st.batches, st.splitStates))
	}

	bSum := bc.stop()
	a.releaseAll(ctx)
	fences := takeAfter(ctx, t, rec, probe, regs, lb, a, keys)
	var notAbove []string
	for _, k := range keys {
		if f, ok := fences[k]; !ok || f <= a.lock(k).Fence() {
			notAbove = append(notAbove, fmt.Sprintf("%s: A %d, B %d", k, a.lock(k).Fence(), f))
		}
	}
	if len(notAbove) > 0 {
		violations = append(violations, fmt.Sprintf("%d keys whose fence did not rise from A to B (first: %s)", len(notAbove), notAbove[0]))
	}

	var perSlot []string
	for i, sl := range slots {
		perSlot = append(perSlot, fmt.Sprintf("%d: %d locks, %s half migrated", sl, len(inSlot[sl]), fmtMS(st.slotTimes[i])))
	}
	figures := fmt.Sprintf("figures: %d locks (%d in slots %v, %d of them of hash tag {%s}); migration took %s in %d batches (slot %s), waits for renewals %s in all; lock renewals completed on a half-migrated slot (a lock counted once per batch): %d of keys already moved, %d of keys not yet moved, %d of them while the slot's locks were split between the masters (%d split states); ASKING served by the target %d times (A's renewals and B's tries); A lost %d locks (%d in the migrated slots), those held all renewed after the hand-over: %t; %s; fences rose on %d of %d keys",
		len(keys), len(flatten(inSlot)), slots, s21Tagged, tag, fmtMS(migrated.Sub(migStart)), st.batches, strings.Join(perSlot, "; slot "), fmtMS(st.waited),
		st.renewedMoved, st.renewedStayed, st.renewedSplit, st.splitStates, askingDuring, len(lost), len(lostMigrated), soft.Failed() == "", bSum, len(keys)-len(notAbove), len(keys))
	t.Log(figures)
	return facts{violations: violations, notes: []string{fmt.Sprintf("slots %v moved from %s to %s", slots, src.Addr, dst.Addr), figures}}
}

// reshardStats counts what scenario 21's migration met.
type reshardStats struct {
	batches, splitStates                      int
	renewedMoved, renewedStayed, renewedSplit int
	waited                                    time.Duration
	slotTimes                                 []time.Duration
}

func flatten(m map[int][]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v...)
	}
	return out
}

// s21Keys picks scenario 21's keys: three adjacent slots inside src's
// range, around the slot of a hash tag; s21PlainPerSlot plain keys in
// each, s21Tagged keys of the tag, and plain keys outside the three up to
// s21Locks. It checks every migrated key's slot with CLUSTER KEYSLOT.
func s21Keys(ctx context.Context, t *testing.T, cc *redis.ClusterClient, src *redistest.Server) (slots []int, keys []string, tag string) {
	t.Helper()
	ranges, err := cc.ClusterSlots(ctx).Result()
	require.NoError(t, err)
	lo, hi := -1, -1
	for _, r := range ranges {
		if len(r.Nodes) > 0 && r.Nodes[0].Addr == src.Addr {
			lo, hi = int(r.Start), int(r.End)
		}
	}
	require.True(t, lo >= 0, "no slot range of %s in CLUSTER SLOTS: %v", src.Addr, ranges)
	for n := 0; n < 100_000 && tag == ""; n++ {
		cand := "s21t" + strconv.Itoa(n)
		if s := slotOf(cand); s > lo && s < hi {
			tag = cand
			slots = []int{s - 1, s, s + 1}
		}
	}
	require.NotEmpty(t, tag, "no hash tag in %d-%d", lo, hi)
	per := map[int]int{}
	var migrated, others []string
	for n := 0; n < 10_000_000 && (len(migrated) < len(slots)*s21PlainPerSlot || len(others) < s21Locks-len(slots)*s21PlainPerSlot-s21Tagged); n++ {
		k := "s21-" + strconv.Itoa(n)
		switch s := lockSlot(k); {
		case slices.Contains(slots, s):
			if per[s] < s21PlainPerSlot {
				per[s]++
				migrated = append(migrated, k)
			}
		case len(others) < s21Locks-len(slots)*s21PlainPerSlot-s21Tagged:
			others = append(others, k)
		}
	}
	for i := range s21Tagged {
		migrated = append(migrated, "{"+tag+"}:"+strconv.Itoa(i))
	}
	require.Len(t, migrated, len(slots)*s21PlainPerSlot+s21Tagged)
	for _, k := range migrated {
		got, err := cc.ClusterKeySlot(ctx, "chaos:"+k).Result()
		require.NoError(t, err)
		require.Equal(t, int64(lockSlot(k)), got, "slot of %q", k)
	}
	return slots, append(migrated, others...), tag
}

// 22a and 22b. CLUSTERDOWN: single on a Cluster of 3 masters without
// replicas (cluster-node-timeout 2 s on every node), 30 locks, 10 on each
// master, kept by a watchdog with a 3 s TTL; B, on its own client, tries
// all 30 keys the whole time. One master is killed (SIGKILL) and stays
// dead until every lock of A has been decided (lost, or renewed after the
// others marked it failed); then it is restarted (without its data: no
// persistence) and rejoins.
//
//   - 22a, cluster-require-full-coverage yes (the default): once the
//     other masters mark the dead one failed, they answer every write,
//     renewals included, with CLUSTERDOWN. Every lock of A is lost, those
//     on the healthy masters too, each at its Deadline (Lost before Until:
//     O5), which is before the key expires on its master, so before any
//     other client could be granted it; B is granted nothing while the
//     cluster is down and every key once it has recovered and A's keys
//     expired. That loss is the price of full coverage, documented in
//     single's package doc, and a loss of liveness, not of safety: HAZARD
//     is the verdict for an oracle the Expectation allows to break, and
//     here none breaks, so the verdict is PASS and the loss is counted in
//     the figures. The scenario checks that the documented loss happens
//     (a lock on a healthy master kept through CLUSTERDOWN is a FAIL: the
//     doc would be wrong) and that the cluster comes back (B granted
//     every key).
//   - 22b, cluster-require-full-coverage no (CONFIG SET on every node): the
//     healthy masters keep serving their slots; A keeps its 20 locks on
//     them (renewed after the dead master was marked failed) and loses
//     the 10 on the dead one, each before B is granted it on the
//     restarted master.
//
// Both require no overlap (O2), Lost before Until (O5), every lock on the
// dead master lost, the cluster back (every master cluster_state:ok) and
// B granted what A lost within two TTLs of that, and fences that rise
// from A to B on every key, the restarted master's too (a fence counter
// created anew starts from the server's clock). The attack must have run:
// the scenario fails (FAIL) when the healthy masters did not report
// cluster_state:fail (22a) or did not flag the dead master failed while
// staying ok (22b) within the wait, and when a write on a healthy master
// was not refused with CLUSTERDOWN while the cluster was down (22a).
func TestScenario22ClusterDown(t *testing.T) {
	for _, full := range []bool{true, false} {
		name := map[bool]string{true: "22a single: CLUSTERDOWN, a master killed, full coverage required",
			false: "22b single: a master killed, cluster-require-full-coverage no"}[full]
		t.Run(map[bool]string{true: "full coverage", false: "partial coverage"}[full], func(t *testing.T) {
			run(t, scenario{name: name, strategy: "single + Cluster (3 masters, no replicas)", faults: "SIGKILL master, restart after the locks were decided"},
				func(t *testing.T, rec *Recorder) facts { return clusterDown(t, rec, full) })
		})
	}
}

const (
	s22PerMaster = 10
	s22TTL       = 3 * time.Second
)

func clusterDown(t *testing.T, rec *Recorder, fullCoverage bool) facts {
	ctx := t.Context()
	masters := redistest.StartCluster(t, 3)
	for _, s := range masters {
		require.NoError(t, s.Client().ConfigSet(ctx, "cluster-node-timeout", "2000").Err(), "CONFIG SET cluster-node-timeout on %s", s.Addr)
		if !fullCoverage {
			require.NoError(t, s.Client().ConfigSet(ctx, "cluster-require-full-coverage", "no").Err(), "CONFIG SET cluster-require-full-coverage on %s", s.Addr)
		}
	}
	ca, cb := redistest.ClusterClient(t, masters), redistest.ClusterClient(t, masters)
	victim, healthy := masters[2], masters[:2]
	regs := redistest.Start(t, redistest.Config{}).Client()
	w := watchdog(t)
	la, lb := sentinelLocker(t, ca, s22TTL, redlease.WithKeeper(w)), sentinelLocker(t, cb, s22TTL)
	probe := redistest.StartStallProbe(t)
	var violations []string

	// 10 keys per master, and one scratch key on the first healthy one.
	byMaster := map[string][]string{}
	var keys []string
	probeKey := ""
	for n := 0; n < 10_000 && (len(keys) < 3*s22PerMaster || probeKey == ""); n++ {
		k := "s22-" + strconv.Itoa(n)
		m, err := ca.MasterForKey(ctx, "chaos:"+k)
		require.NoError(t, err)
		addr := m.Options().Addr
		if probeKey == "" && addr == healthy[0].Addr {
			probeKey = "s22-scratch-" + strconv.Itoa(n)
			if m2, err := ca.MasterForKey(ctx, probeKey); err != nil || m2.Options().Addr != addr {
				probeKey = ""
			}
		}
		if len(byMaster[addr]) < s22PerMaster {
			byMaster[addr] = append(byMaster[addr], k)
			keys = append(keys, k)
		}
	}
	require.Len(t, keys, 3*s22PerMaster)
	require.NotEmpty(t, probeKey)
	onVictim := map[string]bool{}
	for _, k := range byMaster[victim.Addr] {
		onVictim[k] = true
	}

	a := holdAll(ctx, t, rec, probe, regs, la, w, keys)
	defer a.stop()
	drift := a.drift(s22TTL)
	bc := contend(ctx, rec, regs, lb, keys)
	defer bc.stop()

	endKill := fault(rec, "SIGKILL "+victim.Addr+" until the locks were decided")
	killed := time.Now()
	victim.Kill()
	// The healthy masters' view: 22a waits for cluster_state:fail, 22b for
	// the dead master flagged fail with the state still ok.
	soft := &redistest.SoftTB{TB: t}
	last := ""
	probe.WaitFor(soft, 20*time.Second, 3, 20*time.Millisecond, func() bool {
		for _, h := range healthy {
			state := clusterInfoField(ctx, h, "cluster_state")
			flagged := flagsOf(ctx, h, victim.Addr)
			last = fmt.Sprintf("%s: cluster_state %s, flags of %s %q", h.Addr, state, victim.Addr, flagged)
			if fullCoverage && state != "fail" {
				return false
			}
			if !fullCoverage && (state != "ok" || !slices.Contains(strings.Split(flagged, ","), "fail")) {
				return false
			}
		}
		return true
	}, "the healthy masters to see %s failed (%s)", victim.Addr, redistest.Lazy(func() string { return last }))
	if soft.Failed() != "" {
		t.Logf("cluster state: %s", soft.Failed())
		violations = append(violations, "the healthy masters did not see the dead master failed as expected: the attack did not run: "+soft.Failed())
	}
	failedAt := time.Now()
	refusal := "none"
	if err := healthy[0].Client().Set(ctx, probeKey, "x", time.Second).Err(); err != nil {
		refusal = err.Error()
	}
	if fullCoverage && !strings.HasPrefix(refusal, "CLUSTERDOWN") {
		violations = append(violations, fmt.Sprintf("a write on the healthy master %s while the cluster was down was not refused with CLUSTERDOWN: %s", healthy[0].Addr, refusal))
	}

	// Until every lock is decided: lost (its Lost closed: Valid turns
	// false by the clock a moment before the timer closes Lost), or (22b,
	// on a healthy master) renewed by a call that began after the failure
	// was seen.
	renewedSince := func(k string) bool { return a.lock(k).Until().Sub(failedAt) > s22TTL-drift }
	soft = &redistest.SoftTB{TB: t}
	probe.WaitFor(soft, 2*s22TTL, 3, 10*time.Millisecond, func() bool {
		for _, k := range keys {
			if !closed(a.lock(k).Lost()) && (fullCoverage || onVictim[k] || !renewedSince(k)) {
				return false
			}
		}
		return true
	}, "every lock lost or renewed after the failure was seen")
	decided := time.Now()
	var lostHealthy, lostVictim, keptHealthy int
	for _, k := range keys {
		switch lk := a.lock(k); {
		case closed(lk.Lost()) && onVictim[k]:
			lostVictim++
		case closed(lk.Lost()):
			lostHealthy++
		case !onVictim[k] && lk.Valid():
			keptHealthy++
		}
	}
	if lostVictim != s22PerMaster {
		violations = append(violations, fmt.Sprintf("%d of the %d locks on the dead master were lost, want all (%s)", lostVictim, s22PerMaster, soft.Failed()))
	}
	switch {
	case fullCoverage && lostHealthy != 2*s22PerMaster:
		violations = append(violations, fmt.Sprintf("CLUSTERDOWN: %d of the %d locks on healthy masters lost, but single's doc says every one is lost unless the cluster recovers first (%s)", lostHealthy, 2*s22PerMaster, soft.Failed()))
	case !fullCoverage && keptHealthy != 2*s22PerMaster:
		violations = append(violations, fmt.Sprintf("%d of the %d locks on healthy masters kept with cluster-require-full-coverage no, want all (%d lost; %s)", keptHealthy, 2*s22PerMaster, lostHealthy, soft.Failed()))
	}
	grantsWhileDown := len(bc.grants())

	restarted := time.Now()
	victim.Restart()
	endKill()
	require.NoError(t, victim.Client().ConfigSet(ctx, "cluster-node-timeout", "2000").Err())
	soft = &redistest.SoftTB{TB: t}
	probe.WaitFor(soft, 30*time.Second, 3, 20*time.Millisecond, func() bool {
		for _, s := range masters {
			if clusterInfoField(ctx, s, "cluster_state") != "ok" {
				return false
			}
		}
		return true
	}, "every master to report cluster_state:ok after %s's restart", victim.Addr)
	if soft.Failed() != "" {
		violations = append(violations, "the cluster did not recover: "+soft.Failed())
	}
	recovered := time.Now()
	// B gets what A lost: every key (22a) or the dead master's (22b),
	// once the keys expired; at most two TTLs after the recovery.
	want := s22PerMaster
	if fullCoverage {
		want = len(keys)
	}
	soft = &redistest.SoftTB{TB: t}
	probe.WaitFor(soft, 2*s22TTL, 3, 20*time.Millisecond, func() bool { return len(bc.grants()) >= want },
		"B to be granted the %d keys A lost", want)
	bGranted := bc.grants()
	if len(bGranted) < want {
		violations = append(violations, fmt.Sprintf("B was granted %d keys after the recovery, want %d: %s", len(bGranted), want, soft.Failed()))
	}
	var afterLost []time.Duration // B's grant less A's loss, per key
	for k, g := range bGranted {
		if at := a.locks[k].lostAt(); at != NeverLost {
			afterLost = append(afterLost, g.at-at)
		}
	}
	bSum := bc.stop()
	// When each loss was recorded (watchLost's goroutines have long run).
	var lostAfterDown []time.Duration // healthy locks: when lost, after the failure was seen
	var margins []time.Duration       // lost locks: Until less LostAt
	for _, k := range keys {
		one := a.locks[k]
		if at := one.lostAt(); at != NeverLost {
			margins = append(margins, rec.At(one.lk.Until())-at)
			if !onVictim[k] {
				lostAfterDown = append(lostAfterDown, at-rec.At(failedAt))
			}
		}
	}
	stillValid := 0
	for _, k := range keys {
		if a.lock(k).Valid() {
			stillValid++
		}
	}
	a.releaseAll(ctx)
	var rest []string
	for _, k := range keys {
		if _, ok := bGranted[k]; !ok {
			rest = append(rest, k)
		}
	}
	fences := takeAfter(ctx, t, rec, probe, regs, lb, a, rest)
	for k, g := range bGranted {
		fences[k] = g.fence
	}
	rose, roseVictim := 0, 0
	for _, k := range keys {
		if fences[k] > a.lock(k).Fence() {
			if onVictim[k] {
				roseVictim++
			} else {
				rose++
			}
		}
	}
	if rose != 2*s22PerMaster || roseVictim != s22PerMaster {
		violations = append(violations, fmt.Sprintf("fences rose from A to B on %d of the %d keys of the healthy masters and %d of the %d of the restarted one", rose, 2*s22PerMaster, roseVictim, s22PerMaster))
	}

	figures := fmt.Sprintf("figures: %s seen failed by the healthy masters %s after the kill; a write on a healthy master then: %s; locks decided %s after that: lost %d of %d on the dead master, %d of %d on healthy masters (lost %s after the failure was seen), kept %d; every loss %s before its Until at least; B granted %d keys while the master was dead; restarted %s after the kill, cluster ok on every master %s after the restart; B granted %d keys (each %s after A's loss at least), %d of A's locks still valid then; %s; fences rose on %d of %d keys of the healthy masters, on %d of %d of the restarted master (whose fence counters were lost with its data: a new counter starts from the server's clock)",
		victim.Addr, fmtMS(failedAt.Sub(killed)), refusal, fmtMS(decided.Sub(failedAt)), lostVictim, s22PerMaster, lostHealthy, 2*s22PerMaster, spread(lostAfterDown), keptHealthy,
		fmtMS(minDur(margins)), grantsWhileDown, fmtMS(restarted.Sub(killed)), fmtMS(recovered.Sub(restarted)), len(bGranted), fmtMS(minDur(afterLost)), stillValid, bSum,
		rose, 2*s22PerMaster, roseVictim, s22PerMaster)
	t.Log(figures)
	return facts{violations: violations, notes: []string{fmt.Sprintf("killed master %s; healthy %s, %s", victim.Addr, healthy[0].Addr, healthy[1].Addr), figures}}
}

// spread is "min–max" of ds in milliseconds, "none" when empty.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmtMS(s[0]) + "–" + fmtMS(s[len(s)-1])
}

// minDur is the least of ds, 0 when empty.
func minDur(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return slices.Min(ds)
}
