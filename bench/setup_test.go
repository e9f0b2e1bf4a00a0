package bench_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rsredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease/internal/redistest"
)

// nodesEnv names externally started nodes (see the package documentation).
const nodesEnv = "REDLEASE_BENCH_NODES"

// proxyChildEnv, when set, turns the test binary into the proxy process: it
// holds the upstream addresses, comma-separated.
const proxyChildEnv = "REDLEASE_BENCH_PROXY_CHILD"

func TestMain(m *testing.M) {
	if ups := os.Getenv(proxyChildEnv); ups != "" {
		runProxyChild(strings.Split(ups, ","))
		return
	}
	// A node that is down makes go-redis log every refused dial.
	redistest.QuietClientLogs()
	os.Exit(m.Run())
}

// runID keeps the keys of one run apart from any other run's on shared nodes.
var runID = func() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}()

// keyFor returns a key unique to this run and benchmark.
func keyFor(b *testing.B, parts ...string) string {
	return "bench:" + runID + ":" + b.Name() + ":" + strings.Join(parts, ":")
}

// nodes returns the addresses of n independent redis-server primaries: from
// REDLEASE_BENCH_NODES if set, otherwise n fresh processes stopped when b ends.
func nodes(b *testing.B, n int) []string {
	b.Helper()
	if env := os.Getenv(nodesEnv); env != "" {
		addrs := strings.Split(env, ",")
		if len(addrs) < n {
			b.Fatalf("%s has %d addresses; these benchmarks need %d", nodesEnv, len(addrs), n)
		}
		return addrs[:n]
	}
	addrs := make([]string, n)
	for i, srv := range redistest.StartN(b, n, redistest.Config{}) {
		addrs[i] = srv.Addr
	}
	return addrs
}

// newClient is the one kind of client every library gets: go-redis
// defaults, plus ContextTimeoutEnabled so that context deadlines bound reads.
func newClient(b *testing.B, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = c.Close() })
	return c
}

func clients(b *testing.B, addrs []string) []*redis.Client {
	cs := make([]*redis.Client, len(addrs))
	for i, a := range addrs {
		cs[i] = newClient(b, a)
	}
	return cs
}

// universal converts for quorum.New.
func universal(cs []*redis.Client) []redis.UniversalClient {
	us := make([]redis.UniversalClient, len(cs))
	for i, c := range cs {
		us[i] = c
	}
	return us
}

// pools converts for redsync.New: the same clients, wrapped.
func pools(cs []*redis.Client) []rsredis.Pool {
	ps := make([]rsredis.Pool, len(cs))
	for i, c := range cs {
		ps[i] = goredis.NewPool(c)
	}
	return ps
}

// reportMedian adds the median of per-op durations as p50-ns/op.
func reportMedian(b *testing.B, per []time.Duration) {
	if len(per) == 0 {
		return
	}
	slices.Sort(per)
	b.ReportMetric(float64(per[len(per)/2].Nanoseconds()), "p50-ns/op")
}

// proxies is a set of proxies (redistest gates), one per node, running in a
// child process so that their allocations stay out of the benchmark's
// numbers.
type proxies struct {
	Addrs []string

	mu  sync.Mutex
	in  io.WriteCloser
	out *bufio.Reader
}

// startProxies starts the child process with one proxy per upstream and
// stops it when b ends.
func startProxies(b *testing.B, upstreams []string) *proxies {
	b.Helper()
	exe, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), proxyChildEnv+"="+strings.Join(upstreams, ","))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatalf("start proxy process: %v", err)
	}
	p := &proxies{in: in, out: bufio.NewReader(outPipe)}
	b.Cleanup(func() {
		_ = in.Close() // the child exits at EOF
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	line, err := p.out.ReadString('\n')
	if err != nil {
		b.Fatalf("proxy process: %v", err)
	}
	p.Addrs = strings.Split(strings.TrimSpace(line), ",")
	if len(p.Addrs) != len(upstreams) {
		b.Fatalf("proxy process answered %q", line)
	}
	return p
}

// do sends one command to the proxy process and waits for its "ok".
func (p *proxies) do(b *testing.B, format string, args ...any) {
	b.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, err := fmt.Fprintf(p.in, format+"\n", args...); err != nil {
		b.Fatalf("proxy process: %v", err)
	}
	line, err := p.out.ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "ok" {
		b.Fatalf("proxy process: %q %v", line, err)
	}
}

// Latency delays node i's replies by ms milliseconds.
func (p *proxies) Latency(b *testing.B, i, ms int) { p.do(b, "latency %d %d", i, ms) }

// Cut makes node i refuse connections, like a crashed node.
func (p *proxies) Cut(b *testing.B, i int) { p.do(b, "cut %d", i) }

// Heal undoes Latency and Cut on node i.
func (p *proxies) Heal(b *testing.B, i int) { p.do(b, "heal %d", i) }

// runProxyChild is the proxy process: it prints the proxies' addresses on
// one line, then runs commands read from stdin until EOF.
func runProxyChild(upstreams []string) {
	tb := &processTB{}
	defer tb.cleanup()
	ps := make([]*redistest.Gate, len(upstreams))
	addrs := make([]string, len(upstreams))
	for i, up := range upstreams {
		ps[i] = redistest.NewGate(tb, up)
		addrs[i] = ps[i].Addr
	}
	fmt.Println(strings.Join(addrs, ","))
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			fmt.Println("bad command")
			continue
		}
		i, err := strconv.Atoi(f[1])
		if err != nil || i < 0 || i >= len(ps) {
			fmt.Println("bad node")
			continue
		}
		switch {
		case f[0] == "latency" && len(f) == 3:
			ms, _ := strconv.Atoi(f[2])
			ps[i].Delay(time.Duration(ms) * time.Millisecond)
		case f[0] == "cut":
			ps[i].Cut()
		case f[0] == "heal":
			ps[i].Heal()
		default:
			fmt.Println("bad command")
			continue
		}
		fmt.Println("ok")
	}
}

// processTB is the part of testing.TB the harness needs, for the proxy
// process, which has no test running.
type processTB struct {
	mu       sync.Mutex
	cleanups []func()
}

func (*processTB) Helper() {}

func (t *processTB) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

func (t *processTB) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "proxy process: "+format+"\n", args...)
	t.cleanup()
	os.Exit(1)
}

func (*processTB) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "proxy process: "+format+"\n", args...)
}

func (*processTB) TempDir() string {
	d, err := os.MkdirTemp("", "redlease-bench-proxy")
	if err != nil {
		panic(err)
	}
	return d
}

func (t *processTB) cleanup() {
	t.mu.Lock()
	fs := t.cleanups
	t.cleanups = nil
	t.mu.Unlock()
	for _, f := range slices.Backward(fs) {
		f()
	}
}

// background is the context of every call: no deadline, so that each
// library applies its own timeouts exactly as it would for a caller who
// passed context.Background().
var background = context.Background()
