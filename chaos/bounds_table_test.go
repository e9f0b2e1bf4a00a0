package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

var boundsOut = flag.String("bounds.out", "", "TestBoundsTable: also write the table to this file")

// boundsAllowance is what the table allows a call past its deadline (issue
// 29's Must-show 1).
const boundsAllowance = 250 * time.Millisecond

// TestBoundsTable (issue 29, Must-show 1) measures, against real
// redis-server processes, how long each lock call takes while the servers
// are paused (SIGSTOP), killed, or black-holed (a Gate that loses every
// message, connections open): every strategy (single, quorum over three
// nodes, failover on a primary with one replica), with go-redis clients
// with and without ContextTimeoutEnabled.
//
//   - With a deadline: TryLock 500 ms, Lock 2 s, Do 2 s, Release and
//     Extend 500 ms (on a lock taken before the fault) each return within
//     the deadline + 250 ms.
//   - Without one: with go-redis's default options (the old quick start's
//     client) and with the README quick start's client(), TryLock and
//     Release return within 2 s, Lock and Do end with ErrUnavailable
//     within redlease.DefaultOutageLimit plus one attempt (2 s allowed).
//
// It is a real-time measurement (about 4 minutes), so it runs only when
// asked, with -chaos.full (never in make test's fast path; make chaos's
// -run TestScenario leaves it out too):
//
//	go -C chaos test -count=1 -timeout 10m -v . -run TestBoundsTable -chaos.full -bounds.out=/tmp/bounds.txt
func TestBoundsTable(t *testing.T) {
	if !*full {
		t.Skip("real-time measurement: runs with -chaos.full")
	}
	redistest.QuietClientLogs()
	var (
		mu   sync.Mutex
		rows []string
		bad  []string
	)
	add := func(row string, ok bool) {
		mu.Lock()
		defer mu.Unlock()
		if !ok {
			row += "  FAIL"
			bad = append(bad, row)
		}
		rows = append(rows, row)
	}
	type client struct {
		name string
		opts func(addr string) *redis.Options
	}
	clients := []client{
		{"cte=true", func(a string) *redis.Options { return &redis.Options{Addr: a, ContextTimeoutEnabled: true} }},
		{"cte=false", func(a string) *redis.Options { return &redis.Options{Addr: a} }},
	}
	noDeadline := []client{
		{"go-redis defaults", func(a string) *redis.Options { return &redis.Options{Addr: a} }},
		{"README client()", func(a string) *redis.Options {
			return &redis.Options{Addr: a, ContextTimeoutEnabled: true, DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second}
		}},
	}
	strategies := []string{"single", "quorum", "failover"}
	faults := []string{"paused", "killed", "black-holed"}

	t.Run("deadline", func(t *testing.T) {
		for _, st := range strategies {
			for _, cl := range clients {
				for _, fault := range faults {
					t.Run(st+"/"+cl.name+"/"+fault, func(t *testing.T) {
						e := boundsEnv(t, st, cl.opts)
						held := e.take(t, "held")
						e.fault(fault)
						ops := []struct {
							name string
							d    time.Duration
							f    func(ctx context.Context) error
						}{
							{"TryLock", 500 * time.Millisecond, func(ctx context.Context) error { _, err := e.l.TryLock(ctx, "k1"); return err }},
							{"Lock", 2 * time.Second, func(ctx context.Context) error { _, err := e.l.Lock(ctx, "k2"); return err }},
							{"Do", 2 * time.Second, func(ctx context.Context) error {
								return e.l.Do(ctx, "k3", func(context.Context, *redlease.Lock) error { return nil })
							}},
							{"Extend", 500 * time.Millisecond, func(ctx context.Context) error { return held.Extend(ctx, 10*time.Second) }},
							{"Release", 500 * time.Millisecond, func(ctx context.Context) error { return held.Release(ctx) }},
						}
						var wg sync.WaitGroup
						cells := make([]string, len(ops))
						oks := make([]bool, len(ops))
						for i, op := range ops {
							if op.name == "Release" {
								continue // after Extend, below: one lock
							}
							wg.Go(func() {
								ctx, cancel := context.WithTimeout(context.Background(), op.d)
								defer cancel()
								start := time.Now()
								err := op.f(ctx)
								took := time.Since(start)
								oks[i] = took <= op.d+boundsAllowance && err != nil
								cells[i] = fmt.Sprintf("%s %v: %v", op.name, op.d, took.Round(time.Millisecond))
							})
						}
						wg.Wait()
						{
							op := ops[4]
							ctx, cancel := context.WithTimeout(context.Background(), op.d)
							start := time.Now()
							err := op.f(ctx)
							cancel()
							took := time.Since(start)
							oks[4] = took <= op.d+boundsAllowance && err != nil
							cells[4] = fmt.Sprintf("%s %v: %v", op.name, op.d, took.Round(time.Millisecond))
						}
						ok := !slices.Contains(oks, false)
						add(fmt.Sprintf("%-8s %-9s %-11s | %s", st, cl.name, fault, strings.Join(cells, " | ")), ok)
						if !ok {
							t.Errorf("past deadline + %v: %s", boundsAllowance, strings.Join(cells, " | "))
						}
					})
				}
			}
		}
	})
	t.Run("no-deadline", func(t *testing.T) {
		for _, st := range strategies {
			for _, cl := range noDeadline {
				for _, fault := range faults {
					t.Run(st+"/"+cl.name+"/"+fault, func(t *testing.T) {
						t.Parallel()
						e := boundsEnv(t, st, cl.opts)
						held := e.take(t, "held")
						e.fault(fault)
						ctx := context.Background()
						var cells []string
						ok := true
						timed := func(name string, limit time.Duration, wantUnavailable bool, f func() error) {
							start := time.Now()
							err := f()
							took := time.Since(start)
							good := took <= limit && err != nil && (!wantUnavailable || errors.Is(err, redlease.ErrUnavailable))
							ok = ok && good
							cells = append(cells, fmt.Sprintf("%s: %v", name, took.Round(time.Millisecond)))
							if !good {
								t.Errorf("%s: %v after %v (limit %v)", name, err, took, limit)
							}
						}
						timed("TryLock", 2*time.Second, false, func() error { _, err := e.l.TryLock(ctx, "k1"); return err })
						{
							timed("Release", 2*time.Second, false, func() error { return held.Release(ctx) })
						}
						outage := redlease.DefaultOutageLimit + 2*time.Second
						timed("Lock", outage, true, func() error { _, err := e.l.Lock(ctx, "k2"); return err })
						timed("Do", outage, true, func() error {
							return e.l.Do(ctx, "k3", func(context.Context, *redlease.Lock) error { return nil })
						})
						add(fmt.Sprintf("%-8s %-17s %-11s | no deadline | %s", st, cl.name, fault, strings.Join(cells, " | ")), ok)
					})
				}
			}
		}
	})
	slices.Sort(rows)
	table := fmt.Sprintf("issue 29 bounds table (allowance %v past each deadline; no deadline: TryLock, Release <= 2s, Lock, Do ErrUnavailable <= DefaultOutageLimit %v + 2s)\n%s\n",
		boundsAllowance, redlease.DefaultOutageLimit, strings.Join(rows, "\n"))
	t.Log("\n" + table)
	if *boundsOut != "" {
		require.NoError(t, os.WriteFile(*boundsOut, []byte(table), 0o644))
	}
	require.Len(t, rows, len(strategies)*len(faults)*(len(clients)+len(noDeadline)), "every cell measured")
	require.Empty(t, bad)
}

// boundsEnvT is one cell's servers, gates and Locker.
type boundsEnvT struct {
	servers []*redistest.Server
	gates   []*redistest.Gate
	l       *redlease.Locker
}

// boundsEnv starts the servers of strategy st (quorum: three; failover: a
// primary and its replica), each reached through a Gate, and a Locker on
// them with go-redis clients of opts.
func boundsEnv(t *testing.T, st string, opts func(string) *redis.Options) *boundsEnvT {
	t.Helper()
	n := 1
	if st == "quorum" {
		n = 3
	}
	e := &boundsEnvT{servers: redistest.StartN(t, n, redistest.Config{})}
	var cs []redis.UniversalClient
	for _, s := range e.servers {
		g := redistest.NewGate(t, s.Addr)
		e.gates = append(e.gates, g)
		c := redis.NewClient(opts(g.Addr))
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	var s redlease.Strategy
	var err error
	switch st {
	case "single":
		s, err = single.New(cs[0])
	case "quorum":
		s, err = quorum.New(cs)
	case "failover":
		rep := redistest.Start(t, redistest.Config{Args: []string{"--replicaof", "127.0.0.1", fmt.Sprint(e.servers[0].Port)}})
		rc := rep.Client()
		t.Cleanup(func() { _ = rc.Close() })
		// Linked within 10 s, widened by 3 × the stall this run measured
		// meanwhile (probe.WaitFor).
		probe := redistest.StartStallProbe(t)
		var (
			info    string
			infoErr error
		)
		probe.WaitFor(t, 10*time.Second, 3, 20*time.Millisecond, func() bool {
			info, infoErr = rc.Info(context.Background(), "replication").Result()
			return strings.Contains(info, "master_link_status:up")
		}, "replica never linked: %s", redistest.Lazy(func() string {
			for _, line := range strings.Split(info, "\n") {
				if strings.HasPrefix(line, "master_link_status:") {
					return strings.TrimSpace(line)
				}
			}
			return fmt.Sprintf("no master_link_status (INFO replication: %v)", infoErr)
		}))
		probe.Stop()
		s, err = failover.New(cs[0])
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.(interface{ Close() error }).Close() })
	e.l, err = redlease.New(s, redlease.WithTTL(10*time.Second))
	require.NoError(t, err)
	return e
}

// take takes key before the fault, for Release and Extend. It uses Lock:
// on failover, a grant the replica has not acknowledged within the WAIT
// timeout (its first ACK can be late on a loaded machine) is an outage,
// which Lock retries; a TryLock failed the cell once that way.
func (e *boundsEnvT) take(t *testing.T, key string) *redlease.Lock {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lk, err := e.l.Lock(ctx, key)
	require.NoError(t, err, "the lock taken before the fault")
	return lk
}

// fault applies fault to every data server of the cell.
func (e *boundsEnvT) fault(fault string) {
	for i, s := range e.servers {
		switch fault {
		case "paused":
			s.Pause()
		case "killed":
			s.Kill()
		case "black-holed":
			e.gates[i].BlackHole()
		}
	}
}
