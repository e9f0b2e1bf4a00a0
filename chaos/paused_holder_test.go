package chaos

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
)

// holderEnv names the environment variable that makes this test binary act
// as a holder process (scenario 9) instead of running tests.
const holderEnv = "REDLEASE_CHAOS_HOLDER"

// holderProcess runs the paused-holder role when the binary was re-executed
// for it, and reports whether it did.
func holderProcess() bool {
	if os.Getenv(holderEnv) == "" {
		return false
	}
	os.Exit(runHolderProcess())
	return true
}

// runHolderProcess is the holder that gets paused: it takes the lock, says
// so, and, when told to go on, writes to the register with its fence —
// unaware that it was stopped for longer than its TTL in between, as after
// a long GC pause.
func runHolderProcess() int {
	env := func(k string) string { return os.Getenv("REDLEASE_CHAOS_" + k) }
	var clients []redis.UniversalClient
	for _, a := range strings.Split(env("NODES"), ",") {
		clients = append(clients, redis.NewClient(&redis.Options{Addr: a}))
	}
	ttl, _ := time.ParseDuration(env("TTL"))
	s, err := quorum.New(clients, quorum.WithFencing())
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	defer s.Close()
	ctx := context.Background()
	locker, err := redlease.New(s, redlease.WithTTL(ttl), redlease.WithPrefix("chaos:"))
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	// Lock calls, not one TryLock: a loaded machine can miss one attempt's
	// node timeout. The minute only bounds a hang.
	lctx, cancel := context.WithTimeout(ctx, time.Minute)
	lk, err := locker.Lock(lctx, env("KEY"))
	cancel()
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	fmt.Printf("GRANTED %d %d\n", lk.Fence(), time.Until(lk.Until()).Microseconds())
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() { // "GO": the parent has stopped and resumed us meanwhile
		return 1
	}
	// A careful holder would check lk.Valid() here; a paused one already
	// did, before the pause. It writes.
	storage := redis.NewClient(&redis.Options{Addr: env("STORAGE")})
	reg := NewRecorder("holder").Register(storage, env("REGISTER"))
	out, err := reg.write(ctx, lk.Fence(), 99)
	if err != nil {
		fmt.Println("ERROR", err)
		return 1
	}
	fmt.Printf("WROTE %v %d %d\n", out.Accepted, out.Fence, out.Value)
	return 0
}

// 9. A holder process is paused (SIGSTOP) past its TTL right after its
// grant; another holder takes the lock and writes; the paused one resumes
// and writes with its old fence. The lock cannot prevent that write — the
// fenced register must refuse it.
func TestScenario09PausedHolderProcess(t *testing.T) {
	run(t, scenario{name: "09 quorum: holder process paused past its TTL", strategy: "quorum/5 (fenced)", faults: "SIGSTOP holder > TTL", fast: true},
		func(t *testing.T, rec *Recorder) facts {
			ctx := t.Context()
			probe := redistest.StartStallProbe(t)
			ns := StartNodes(t, 5, redistest.Config{})
			store := redistest.Start(t, redistest.Config{})
			reg := rec.Register(store.Client(), "register:s09")
			const ttl = 500 * time.Millisecond
			_, lb := quorumLocker(t, ns.Clients("b"), ttl)
			addrs := make([]string, len(ns.Servers))
			for i, s := range ns.Servers {
				addrs[i] = s.Addr
			}
			self, err := os.Executable()
			if err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(self, "-test.run=^$")
			cmd.Env = append(os.Environ(), holderEnv+"=1",
				"REDLEASE_CHAOS_NODES="+strings.Join(addrs, ","), "REDLEASE_CHAOS_TTL="+ttl.String(),
				"REDLEASE_CHAOS_KEY=s09", "REDLEASE_CHAOS_STORAGE="+store.Addr, "REDLEASE_CHAOS_REGISTER=register:s09")
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			stdin, _ := cmd.StdinPipe()
			stdout, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			lines := bufio.NewScanner(stdout)
			next := func() []string {
				if !lines.Scan() {
					t.Fatalf("holder process said nothing: %v", lines.Err())
				}
				return strings.Fields(lines.Text())
			}
			g := next()
			if len(g) != 3 || g[0] != "GRANTED" {
				t.Fatalf("holder process: %v", g)
			}
			from := rec.Now()
			fence, _ := strconv.ParseUint(g[1], 10, 64)
			validUs, _ := strconv.ParseInt(g[2], 10, 64)
			until := from + time.Duration(validUs)*time.Microsecond // on our clock, no earlier than the holder's
			end := fault(rec, "SIGSTOP holder")
			_ = cmd.Process.Signal(syscall.SIGSTOP)

			// B is granted (and writes) once the holder's keys expire: the
			// pause lasts until B has s09Grants grants, within the liveness
			// window (guard), not for a fixed time.
			w := &Workload{Rec: rec, Reg: reg, Key: "s09", Hold: 20 * time.Millisecond}
			w.Phase("paused")
			over, explain := guard(probe, time.Now())
			stop := w.Start(ctx, map[string]*redlease.Locker{"b": lb})
			w.WaitFor(ctx, func() bool { return w.Counts("paused", "b").Grants >= s09Grants || over() })
			stop()
			bGrants := w.Counts("paused", "b").Grants
			_ = cmd.Process.Signal(syscall.SIGCONT)
			end()
			call := rec.Now()
			fmt.Fprintln(stdin, "GO")
			wr := next()
			ret := rec.Now()
			if len(wr) != 4 || wr[0] != "WROTE" {
				t.Fatalf("holder process: %v", wr)
			}
			accepted := wr[1] == "true"
			sf, _ := strconv.ParseUint(wr[2], 10, 64)
			sv, _ := strconv.ParseInt(wr[3], 10, 64)
			reg.WriteBy("paused", fence, 99, accepted, sf, sv, call, ret)
			rec.AddHold(Hold{Holder: "paused", Fence: fence, From: from, To: until, Until: until, LostAt: NeverLost})
			var violations []string
			if bGrants < s09Grants {
				violations = append(violations, fmt.Sprintf("B had %d of %d grants while the holder was paused: %s", bGrants, s09Grants, explain()))
			}
			if accepted {
				violations = append(violations, "the paused holder's late write was accepted")
			}
			return facts{violations: violations, notes: []string{fmt.Sprintf("paused holder's write with fence %d after the pause: accepted=%v (register at fence %d)", fence, accepted, sf)}}
		})
}

// s09Grants is how many grants B has while the holder of scenario 9 is
// paused.
const s09Grants = 3
