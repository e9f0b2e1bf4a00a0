package redlease_test

import (
	"context"
	"flag"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// TestMain runs this package's parallel tests four at a time unless the
// run names -test.parallel (go test -parallel): they wait on real TTLs,
// backoffs and paused servers rather than on the CPU, and the default
// (GOMAXPROCS, 2 on a 2-core machine) kept the package's run about half
// of its wall time longer. Tests that count goroutines or wake hubs do not
// call t.Parallel: they run before any parallel test starts.
func TestMain(m *testing.M) {
	flag.Parse()
	named := false
	flag.Visit(func(f *flag.Flag) { named = named || f.Name == "test.parallel" })
	if !named {
		if err := flag.Set("test.parallel", "4"); err != nil {
			panic(err)
		}
	}
	goleak.VerifyTestMain(m)
}

// fake is an in-memory Strategy: one map, expiry on the caller's clock, and
// a queue of errors to return from the next calls.
type fake struct {
	mu       sync.Mutex
	held     map[string]holder
	fence    uint64
	acquires []string // tokens seen by Acquire, in order
	keys     []string // keys seen by Acquire, in order
	failNext []error  // returned (and popped) by the next Acquire/Extend calls
	releases int
}

type holder struct {
	token string
	until time.Time
}

func newFake() *fake { return &fake{held: map[string]holder{}} }

func (f *fake) pop() error {
	if len(f.failNext) == 0 {
		return nil
	}
	err := f.failNext[0]
	f.failNext = f.failNext[1:]
	return err
}

func (f *fake) Acquire(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acquires = append(f.acquires, token)
	f.keys = append(f.keys, key)
	if err := f.pop(); err != nil {
		return redlease.Grant{}, err
	}
	h, ok := f.held[key]
	if ok && h.token != token && time.Now().Before(h.until) {
		return redlease.Grant{}, redlease.ErrNotObtained
	}
	f.fence++
	until := time.Now().Add(ttl)
	f.held[key] = holder{token, until}
	return redlease.Grant{Until: until, Fence: f.fence}, nil
}

func (f *fake) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.pop(); err != nil {
		return redlease.Grant{}, err
	}
	h, ok := f.held[key]
	if !ok || h.token != token || !time.Now().Before(h.until) {
		return redlease.Grant{}, redlease.ErrNotHeld
	}
	until := time.Now().Add(ttl)
	f.held[key] = holder{token, until}
	return redlease.Grant{Until: until}, nil
}

// DriftAllowance is 0: the fake's grants end exactly at the call's start
// plus the TTL, on the same clock.
func (f *fake) DriftAllowance(time.Duration) time.Duration { return 0 }

func (f *fake) Release(ctx context.Context, key, token string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.releases++
	h, ok := f.held[key]
	if !ok || h.token != token {
		return redlease.ErrNotHeld
	}
	delete(f.held, key)
	return nil
}

// fakeLock makes a Locker on a new fake with opts and takes "k" with
// TryLock; an error fails t.
func fakeLock(t *testing.T, opts ...redlease.Option) (*fake, *redlease.Locker, *redlease.Lock) {
	t.Helper()
	f := newFake()
	l := newLocker(t, f, opts...)
	lk, err := l.TryLock(t.Context(), "k")
	require.NoError(t, err)
	return f, l, lk
}

// singleNode starts a real redis-server and returns a single strategy on it.
func singleNode(t *testing.T) redlease.Strategy {
	t.Helper()
	strategy, err := single.New(redistest.Start(t, redistest.Config{}).Client())
	require.NoError(t, err)
	return strategy
}

// newLocker is redlease.New for a test: an error fails it.
func newLocker(t *testing.T, s redlease.Strategy, opts ...redlease.Option) *redlease.Locker {
	t.Helper()
	l, err := redlease.New(s, opts...)
	require.NoError(t, err)
	return l
}

// singleLocker is a Locker on the single strategy over c; a constructor's
// error fails t.
func singleLocker(t *testing.T, c redis.UniversalClient, opts ...redlease.Option) *redlease.Locker {
	t.Helper()
	s, err := single.New(c)
	require.NoError(t, err)
	return newLocker(t, s, opts...)
}

// watchGoroutines counts the goroutines of the default watchdog (any
// goroutine with a frame in the renewal engine).
func watchGoroutines() int {
	n, _ := watchStacks()
	return n
}

// watchStacks returns the number of the default watchdog's goroutines and
// their stacks.
func watchStacks() (int, []string) {
	var stacks []string
	for _, g := range goroutineStacks() {
		if strings.Contains(g, "github.com/redlease/redlease/internal/renewal.") {
			stacks = append(stacks, g)
		}
	}
	return len(stacks), stacks
}

// goroutineStacks returns the stack of every goroutine of the process.
func goroutineStacks() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Split(string(buf[:n]), "\n\n")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// waitNoWatchGoroutines waits for the default watchdog to go idle: for 5 s
// plus 3 × what a probe measured this process stalled meanwhile.
func waitNoWatchGoroutines(t *testing.T) {
	t.Helper()
	probe := redistest.StartStallProbe(t)
	defer probe.Stop()
	probe.WaitFor(t, 5*time.Second, 3, 5*time.Millisecond, func() bool { return watchGoroutines() == 0 },
		"the default watchdog's goroutines end once no Do runs")
}

// grantNodeTimeout is the quorum node timeout of the tests' strategies
// whose grants must succeed (quorumOver's, unless a test gives its own,
// which comes later and wins): at load 20-27 the default, 100 ms, was
// missed by live nodes, and TestExtendRespectsDelayedRestartLimit,
// TestCommonMessagesShowThePrefixOnce and others were refused a grant
// their checks need. 2 s is 20 times the default; only a node that hangs,
// or a process stopped that long, misses it.
const grantNodeTimeout = 2 * time.Second

// quorumOver builds a quorum strategy over clients, closed by t.Cleanup.
func quorumOver(t *testing.T, cs []redis.UniversalClient, opts ...quorum.Option) *quorum.Strategy {
	q, err := quorum.New(cs, append([]quorum.Option{quorum.WithNodeTimeout(grantNodeTimeout)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = q.Close() })
	return q
}

// directClients returns a client per server, straight to it.
func directClients(t *testing.T, servers []*redistest.Server) []redis.UniversalClient {
	cs := make([]redis.UniversalClient, len(servers))
	for i, s := range servers {
		cs[i] = s.Client()
	}
	return cs
}

// loadScripts puts the lock scripts into a server's cache, so that no
// NOSCRIPT round trip changes the order of requests a test gates.
func loadScripts(t *testing.T, c redis.Scripter) {
	for _, s := range []*script.Script{script.Acquire, script.Release, script.Extend, script.RaiseFence} {
		require.NoError(t, s.Load(t.Context(), c))
	}
}

type lockResult struct {
	lk  *redlease.Lock
	err error
}

// lockAsync runs l.Lock in the background (bounded by 30 s).
func lockAsync(ctx context.Context, l *redlease.Locker, key string, opts ...redlease.LockOption) <-chan lockResult {
	got := make(chan lockResult, 1)
	go func() {
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		lk, err := l.Lock(lctx, key, opts...)
		got <- lockResult{lk, err}
	}()
	return got
}

// replicated waits (bounded: 10 s plus 3 × what a probe measured this
// process stalled meanwhile) until a write on c is acknowledged by one
// replica, so that the pause below is what makes WAIT fall short.
func replicated(t *testing.T, c *redis.Client) {
	t.Helper()
	probe := redistest.StartStallProbe(t)
	defer probe.Stop()
	probe.WaitFor(t, 10*time.Second, 3, 20*time.Millisecond, func() bool {
		n, err := c.Do(t.Context(), "WAIT", 1, 100).Int64()
		return err == nil && n == 1
	}, "the replica never acknowledged")
}

// plain is a Strategy with the three methods only: it states no drift
// allowance (nor anything else).
type plain struct{ s redlease.Strategy }

func (p plain) Acquire(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	return p.s.Acquire(ctx, key, token, ttl)
}

func (p plain) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	return p.s.Extend(ctx, key, token, ttl)
}

func (p plain) Release(ctx context.Context, key, token string) error {
	return p.s.Release(ctx, key, token)
}

// keeper records what Do asks of it.
type keeper struct {
	mu      sync.Mutex
	kept    []*redlease.Lock
	stopped int
}

func (k *keeper) Keep(lk *redlease.Lock) func() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.kept = append(k.kept, lk)
	return func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		k.stopped++
	}
}
