package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/single"
	"github.com/stretchr/testify/require"
)

// sentinelHazard is what single and failover on one primary cannot promise.
const sentinelHazard = "asynchronous replication: a failover can promote a replica that never received the lock"

// sentinelLocker is a Locker on the single strategy over c with the
// scenarios' prefix and ttl; a constructor's error fails t.
func sentinelLocker(t *testing.T, c redis.UniversalClient, ttl time.Duration, opts ...redlease.Option) *redlease.Locker {
	t.Helper()
	s, err := single.New(c)
	require.NoError(t, err)
	l, err := redlease.New(s, append([]redlease.Option{redlease.WithTTL(ttl), redlease.WithPrefix("chaos:")}, opts...)...)
	require.NoError(t, err)
	return l
}

// holdUntilLost takes key through locker (kept by its watchdog) and holds it
// until it is lost or patience runs out, recording the hold and one register
// write. It returns when the lock was lost or released.
func holdUntilLost(ctx context.Context, t *testing.T, rec *Recorder, reg *Register, locker *redlease.Locker, holder, key string, patience time.Duration) (granted <-chan *redlease.Lock, done <-chan error) {
	g := make(chan *redlease.Lock, 1)
	d := make(chan error, 1)
	go func() {
		d <- locker.Do(ctx, key, func(ctx context.Context, lk *redlease.Lock) error {
			from := rec.Now()
			_, _ = reg.Write(ctx, holder, lk.Fence(), 1)
			g <- lk
			lostAt := NeverLost
			select {
			case <-ctx.Done():
				lostAt = rec.Now()
			case <-time.After(patience):
			}
			to := rec.Now()
			rec.AddHold(Hold{Holder: holder, Fence: lk.Fence(), From: from, To: min(to, rec.At(lk.Until())), Until: rec.At(lk.Until()), LostAt: lostAt})
			return nil
		})
	}()
	return g, d
}

// 4 and 5. single on a Sentinel-managed primary, failover before
// replication: the replication link is black-holed, A takes the lock on the
// primary only, then the replica is promoted (forced SENTINEL FAILOVER, or
// SIGKILL of the primary and Sentinel's own failover). B is granted the
// same key on the new primary: the documented hazard, recorded. A's next
// renewal finds the key not its own and A is told (Lost before Until); the
// fence counter did not survive either, so B's fence is not above A's and
// the register refuses B: O1 holds.
func TestScenario04SingleFailoverBeforeReplication(t *testing.T) {
	singleFailover(t, false)
}

func TestScenario05SingleKillPrimaryBeforeReplication(t *testing.T) {
	singleFailover(t, true)
}

func singleFailover(t *testing.T, kill bool) {
	name, faults := "04 single: failover before replication", "replication black-holed, SENTINEL FAILOVER"
	if kill {
		name, faults = "05 single: primary killed before replication", "replication black-holed, SIGKILL primary"
	}
	run(t, scenario{name: name, strategy: "single + Sentinel", faults: faults, fast: !kill,
		exp: Expectation{AllowOverlap: true, Why: sentinelHazard}},
		func(t *testing.T, rec *Recorder) facts {
			ctx := t.Context()
			g := StartSentinelGroup(t, "s"+slug(name)[:2], time.Second)
			reg := storage(t, rec, "sentinel")
			w := watchdog(t)
			const ttl = 10 * time.Second // longer than a failover: A is still valid when B gets in
			la := sentinelLocker(t, g.Client(t), ttl, redlease.WithKeeper(w))
			lb := sentinelLocker(t, g.Client(t), ttl,
				redlease.WithRetryDelay(5*time.Millisecond, 50*time.Millisecond))
			old, err := g.PrimaryAddr(ctx, t)
			if err != nil {
				t.Fatal(err)
			}
			endLink := fault(rec, "replication black-holed")
			g.Link.BlackHole("bh")

			granted, aDone := holdUntilLost(ctx, t, rec, reg, la, "a", "s04", 20*time.Second)
			<-granted
			endFail := fault(rec, map[bool]string{false: "SENTINEL FAILOVER", true: "SIGKILL primary"}[kill])
			start := time.Now()
			if kill {
				g.Primary.Kill()
			} else if err := g.SentinelClients(t)[0].Failover(ctx, g.Master).Err(); err != nil {
				t.Fatal(err)
			}
			newAddr, err := g.WaitForNewPrimary(ctx, t, old, 15*time.Second)
			endFail()
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)

			wb := &Workload{Rec: rec, Reg: reg, Key: "s04", Hold: 50 * time.Millisecond, Attempt: 500 * time.Millisecond}
			stop := make(chan struct{})
			bDone := make(chan int, 1)
			go func() { bDone <- wb.Run(ctx, "b", lb, stop) }()
			aErr := <-aDone
			sleep(ctx, 500*time.Millisecond)
			close(stop)
			<-bDone
			g.Link.Heal()
			endLink()
			notes := []string{fmt.Sprintf("primary moved %s → %s %v after the fault", old, newAddr, took.Round(time.Millisecond))}
			var violations []string
			if !errors.Is(aErr, redlease.ErrLost) {
				violations = append(violations, fmt.Sprintf("the first holder was not told of the loss: %v", aErr))
			}
			return facts{notes: notes, violations: violations}
		})
}

// 7. Negative control: a coordinated FAILOVER (the primary waits for its
// replica to catch up before handing over). The lock survives on the new
// primary: nobody else is granted it before it expires, and the holder,
// whose client still points at the old primary, is told before Until.
func TestScenario07CoordinatedFailoverKeepsTheLock(t *testing.T) {
	run(t, scenario{name: "07 single: coordinated FAILOVER (control)", strategy: "single", faults: "FAILOVER (coordinated)", fast: true},
		func(t *testing.T, rec *Recorder) facts {
			ctx := t.Context()
			probe := redistest.StartStallProbe(t)
			primary := redistest.Start(t, redistest.Config{})
			replica := redistest.StartReplica(t, primary, redistest.Config{})
			reg := storage(t, rec, "s07")
			w := watchdog(t)
			const ttl = 2 * time.Second
			la := sentinelLocker(t, primary.Client(), ttl, redlease.WithKeeper(w))
			lb := sentinelLocker(t, replica.Client(), ttl)

			granted, aDone := holdUntilLost(ctx, t, rec, reg, la, "a", "s07", 5*time.Second)
			a := <-granted
			end := fault(rec, "FAILOVER")
			if err := primary.Client().Do(ctx, "FAILOVER", "TIMEOUT", 2000).Err(); err != nil {
				t.Fatal(err)
			}
			// The replica is promoted within 5 s, widened by 3 × the stall
			// this run measured meanwhile (probe.WaitFor): without the
			// failover the control would check nothing.
			var (
				role    []any
				roleErr error
			)
			probe.WaitFor(t, 5*time.Second, 3, 10*time.Millisecond, func() bool {
				role, roleErr = replica.Client().Do(ctx, "ROLE").Slice()
				return len(role) > 0 && role[0] == "master"
			}, "the coordinated FAILOVER never promoted the replica: its ROLE %s; the old primary's %s", redistest.Lazy(func() string {
				return fmt.Sprintf("%v (error %v)", role, roleErr)
			}), redistest.Lazy(func() string {
				info, err := primary.Client().Info(context.WithoutCancel(ctx), "replication").Result()
				for _, line := range strings.Split(info, "\n") {
					if strings.HasPrefix(line, "master_failover_state:") {
						return strings.TrimSpace(line)
					}
				}
				return fmt.Sprintf("failover state unknown (INFO replication: %v)", err)
			}))
			end()
			var violations []string
			if v, _ := replica.Client().Get(ctx, "chaos:s07").Result(); v != a.Token() {
				violations = append(violations, fmt.Sprintf("the new primary does not hold the lock: %q", v))
			}
			wb := &Workload{Rec: rec, Reg: reg, Key: "s07", Hold: 20 * time.Millisecond}
			stop := make(chan struct{})
			bDone := make(chan int, 1)
			go func() { bDone <- wb.Run(ctx, "b", lb, stop) }()
			<-aDone // A's renewals hit the demoted primary (READONLY) until its deadline
			sleep(ctx, ttl)
			close(stop)
			<-bDone
			return facts{violations: violations}
		})
}

// 8. The failover strategy under the faults of 4 and 5: with the link
// black-holed WAIT is answered by no replica, so the lock is refused
// instead of granted on the primary alone, and the failover cannot produce
// a double grant.
func TestScenario08FailoverStrategyRefusesUnreplicatedGrants(t *testing.T) {
	for _, kill := range []bool{false, true} {
		t.Run(map[bool]string{false: "forced failover", true: "primary killed"}[kill], func(t *testing.T) {
			name := "08a failover: link black-holed, SENTINEL FAILOVER"
			if kill {
				name = "08b failover: link black-holed, SIGKILL primary"
			}
			run(t, scenario{name: name, strategy: "failover (WAIT 1)", faults: "replication black-holed, " + map[bool]string{false: "SENTINEL FAILOVER", true: "SIGKILL primary"}[kill], fast: !kill},
				func(t *testing.T, rec *Recorder) facts {
					ctx := t.Context()
					g := StartSentinelGroup(t, "s08"+map[bool]string{false: "a", true: "b"}[kill], time.Second)
					reg := storage(t, rec, "s08")
					const ttl = 3 * time.Second
					mk := func() *redlease.Locker {
						strategy2, err := failover.New(g.Client(t), failover.WithWaitTimeout(50*time.Millisecond))
						require.NoError(t, err)
						locker, err := redlease.New(strategy2,
							redlease.WithTTL(ttl), redlease.WithPrefix("chaos:"), redlease.WithRetryDelay(5*time.Millisecond, 50*time.Millisecond))
						require.NoError(t, err)
						return locker
					}
					la, lb := mk(), mk()
					old, err := g.PrimaryAddr(ctx, t)
					if err != nil {
						t.Fatal(err)
					}
					endLink := fault(rec, "replication black-holed")
					g.Link.BlackHole("bh")
					var refused error
					if _, err := la.TryLock(ctx, "s08"); err == nil {
						t.Error("granted without a replica's acknowledgement")
					} else {
						refused = err
						rec.Failure("a", err)
					}
					endFail := fault(rec, "failover")
					if kill {
						g.Primary.Kill()
					} else if err := g.SentinelClients(t)[0].Failover(ctx, g.Master).Err(); err != nil {
						t.Fatal(err)
					}
					_, err = g.WaitForNewPrimary(ctx, t, old, 15*time.Second)
					endFail()
					if err != nil {
						t.Fatal(err)
					}
					wb := &Workload{Rec: rec, Reg: reg, Key: "s08", Hold: 20 * time.Millisecond, Attempt: 300 * time.Millisecond}
					stop := make(chan struct{})
					go func() { sleep(ctx, time.Second); close(stop) }()
					wb.Run(ctx, "b", lb, stop)
					g.Link.Heal()
					endLink()
					var violations []string
					if refused != nil && !errors.Is(refused, failover.ErrNotReplicated) {
						violations = append(violations, "refusal is not ErrNotReplicated: "+refused.Error())
					}
					return facts{violations: violations, notes: []string{
						"after the failover no replica acknowledges either (the old primary is " +
							strings.ToLower(map[bool]string{false: "not yet reconfigured", true: "dead"}[kill]) + "): no grants, by design"}}
				})
		})
	}
}

// 6. Split brain: the old primary and one client (A) are cut off from the
// Sentinels and the replica. The Sentinels promote the replica; B, on their
// side, is granted the lock there while A still renews it on the isolated
// old primary — a double grant, outside the single strategy's assumptions,
// recorded. On healing, Sentinel demotes the old primary; A's renewals get
// READONLY, which counts as undecided, not as a reason to take the lock
// again: A is told before its Until and stops. Fences keep O1.
func TestScenario06SplitBrain(t *testing.T) {
	run(t, scenario{name: "06 single: split brain, then heal", strategy: "single + Sentinel", faults: "old primary + A isolated from Sentinels and replica; heal",
		exp: Expectation{AllowOverlap: true, Why: sentinelHazard + " (split brain)"}},
		func(t *testing.T, rec *Recorder) facts {
			ctx := t.Context()
			g := StartIsolatableGroup(t, "s06", time.Second)
			reg := storage(t, rec, "s06")
			w := watchdog(t)
			const ttl = 6 * time.Second
			// A talks to the old primary directly, as a client on its side of
			// the partition would.
			la := sentinelLocker(t, g.Primary.Client(), ttl, redlease.WithKeeper(w))
			lb := sentinelLocker(t, g.Client(t), ttl,
				redlease.WithRetryDelay(5*time.Millisecond, 50*time.Millisecond))
			old, err := g.PrimaryAddr(ctx, t)
			if err != nil {
				t.Fatal(err)
			}
			granted, aDone := holdUntilLost(ctx, t, rec, reg, la, "a", "s06", 30*time.Second)
			<-granted
			end := fault(rec, "partition: {old primary, A} | {Sentinels, replica, B}")
			g.Front.Cut()
			g.Link.BlackHole("bh")
			newAddr, err := g.WaitForNewPrimary(ctx, t, old, 20*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			wb := &Workload{Rec: rec, Reg: reg, Key: "s06", Hold: 50 * time.Millisecond, Attempt: 500 * time.Millisecond}
			stop := make(chan struct{})
			bDone := make(chan int, 1)
			go func() { bDone <- wb.Run(ctx, "b", lb, stop) }()
			sleep(ctx, time.Second)
			g.Front.Heal()
			g.Link.Heal()
			end()
			// Sentinel demotes the old primary at its next look; do it now.
			if err := reattach(ctx, g, newAddr); err != nil {
				t.Fatal(err)
			}
			aErr := <-aDone
			close(stop)
			<-bDone
			var violations []string
			if !errors.Is(aErr, redlease.ErrLost) {
				violations = append(violations, fmt.Sprintf("A was not told of the loss: %v", aErr))
			}
			return facts{violations: violations, notes: []string{"primary moved " + old + " → " + newAddr}}
		})
}
