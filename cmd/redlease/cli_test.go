package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/gobuild"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
)

// bin is the CLI, built once for the tests and run as a real process.
var bin string

// buildFlags are the -race and -trimpath this test binary was built with
// (gobuild.Flags), set by TestMain: goBuild builds the CLI with them.
var buildFlags []string

// goBuild is the go build of the CLI into out, as this test binary was
// built (buildFlags: the race detector watches the CLI too, and its
// dependencies come from the build cache), then extra.
func goBuild(out string, extra ...string) *exec.Cmd {
	return exec.Command("go", slices.Concat([]string{"build"}, buildFlags, extra, []string{"-o", out, "."})...)
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "redlease-cli")
	if err != nil {
		panic(err)
	}
	bin = filepath.Join(dir, "redlease")
	if buildFlags, err = gobuild.Flags(); err != nil {
		panic(err)
	}
	if out, err := goBuild(bin).CombinedOutput(); err != nil {
		panic(string(out))
	}
	if slices.Contains(buildFlags, "-race") {
		// A race-built program sleeps a second before it exits (GORACE's
		// atexit_sleep_ms, 1000 by default); the CLI's processes exit as
		// the plain build's do, and options set from outside are kept.
		if err := os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0")); err != nil {
			panic(err)
		}
	}
	redistest.QuietClientLogs()
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			panic(err)
		}
	}
	os.Exit(code)
}

func nodesEnv(servers []*redistest.Server) string {
	addrs := make([]string, len(servers))
	for i, s := range servers {
		addrs[i] = s.Addr
	}
	return "REDLEASE_NODES=" + strings.Join(addrs, ",")
}

// cliNodeTimeout is the quorum node timeout every CLI run of these tests
// starts with (the CLI's default is quorum.DefaultNodeTimeout, 100 ms): a
// test that needs a grant must not fail because a loaded machine kept three
// nodes from answering within 100 ms (at load 18, a CI-loop run beside
// yes x2 and two other test runs, TestNotObtainedExitCode,
// TestMajorityKilledStopsTheCommand and TestExitCodes' "71 no /proc" were
// not granted: "0 of 3 nodes agreed ... no reply within the node timeout of
// 100ms"). 2 s is 20 times the default; only a node that hangs, or a
// process stopped for that long, misses it. A test about the node timeout
// gives its own --node-timeout after this one, which wins.
const cliNodeTimeout = 2 * time.Second

// cliCommand is the binary run with args, after --node-timeout
// cliNodeTimeout (a flag of every command).
func cliCommand(args ...string) *exec.Cmd {
	return exec.Command(bin, append([]string{"--node-timeout", cliNodeTimeout.String()}, args...)...)
}

// cli runs the binary and returns stdout and the exit code.
func cli(t *testing.T, env string, args ...string) (string, int) {
	t.Helper()
	cmd := cliCommand(args...)
	cmd.Env = append(os.Environ(), env)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), ee.ExitCode()
	}
	require.NoError(t, err)
	return out.String(), 0
}

func TestRunPrintsTheFence(t *testing.T) {
	env := nodesEnv(redistest.StartN(t, 3, redistest.Config{}))
	out, code := cli(t, env, "run", "--key", "demo", "--", "sh", "-c", "echo $REDLEASE_FENCE; sleep 1")
	require.Zero(t, code)
	fence, err := strconv.Atoi(strings.TrimSpace(out))
	require.NoError(t, err, "stdout %q", out)
	assert.Positive(t, fence)
	out, _ = cli(t, env, "run", "--key", "demo", "--", "sh", "-c", "echo $REDLEASE_FENCE")
	next, _ := strconv.Atoi(strings.TrimSpace(out))
	assert.Greater(t, next, fence, "the next holder's fence is higher")

	_, code = cli(t, env, "run", "--key", "demo", "--", "sh", "-c", "exit 3")
	assert.Equal(t, 3, code, "run exits with the command's status")
}

func TestConcurrentRunsSerialize(t *testing.T) {
	env := nodesEnv(redistest.StartN(t, 3, redistest.Config{}))
	type span struct{ from, to int64 }
	var (
		mu    sync.Mutex
		spans []span
		wg    sync.WaitGroup
	)
	for range 3 {
		wg.Go(func() {
			out, code := cli(t, env, "run", "--key", "serial", "--wait", "10s", "--",
				"sh", "-c", "date +%s%N; sleep 0.3; date +%s%N")
			assert.Zero(t, code)
			f := strings.Fields(out)
			if len(f) != 2 {
				t.Errorf("output %q", out)
				return
			}
			from, _ := strconv.ParseInt(f[0], 10, 64)
			to, _ := strconv.ParseInt(f[1], 10, 64)
			mu.Lock()
			spans = append(spans, span{from, to})
			mu.Unlock()
		})
	}
	wg.Wait()
	require.Len(t, spans, 3)
	for i, a := range spans {
		for j, b := range spans {
			if i < j {
				assert.True(t, a.to <= b.from || b.to <= a.from, "runs %d and %d overlapped: %v %v", i, j, a, b)
			}
		}
	}
}

func TestNotObtainedExitCode(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Config{})
	var clients []redis.UniversalClient
	for _, s := range servers {
		clients = append(clients, s.Client())
	}
	q, err := quorum.New(clients, quorum.WithNodeTimeout(cliNodeTimeout))
	require.NoError(t, err)
	defer q.Close()
	locker, err := redlease.New(q, redlease.WithPrefix("lock:"))
	require.NoError(t, err)
	lk, err := locker.TryLock(t.Context(), "busy")
	require.NoError(t, err)
	defer lk.Release(context.Background())

	out, code := cli(t, nodesEnv(servers), "run", "--key", "busy", "--", "sh", "-c", "echo ran")
	assert.Equal(t, exitNotObtained, code)
	assert.Empty(t, out, "the command did not run")

	js, code := cli(t, nodesEnv(servers), "inspect", "busy", "--json")
	require.Zero(t, code)
	var v keyView
	require.NoError(t, json.Unmarshal([]byte(js), &v))
	assert.True(t, v.Majority)
	assert.GreaterOrEqual(t, v.Agreeing, 2)
	assert.Equal(t, lk.Token(), v.Token)
	assert.Equal(t, "held", v.State)
}

// Killing the majority while the command runs: the lock can no longer be
// renewed, the CLI sends the command SIGTERM and exits with the lost code.
func TestMajorityKilledStopsTheCommand(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Config{})
	cmd := cliCommand("run", "--key", "job", "--ttl", "2s", "--loss-margin", "800ms", "--grace", "500ms", "--",
		"sh", "-c", `trap 'echo TERM; exit 143' TERM; echo started; sleep 30 & wait`)
	cmd.Env = append(os.Environ(), nodesEnv(servers))
	var stderr syncBuffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	lines := bufio.NewScanner(stdout)
	require.True(t, lines.Scan(), "no first line from the command; the CLI's stderr: %s", stderr.String())
	require.Equal(t, "started", lines.Text())

	probe := redistest.StartStallProbe(t)
	servers[0].Kill()
	servers[1].Kill()
	start := time.Now()
	got := make(chan string, 4)
	go func() {
		for lines.Scan() {
			got <- lines.Text()
		}
		close(got)
	}()
	err = cmd.Wait()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, exitLost, ee.ExitCode())
	assertWithin(t, probe, 5*time.Second, start, "noticed within the TTL")
	assert.Equal(t, "TERM", <-got, "the command was sent SIGTERM")
}

func TestDoctorSaysWhatIsUnsafe(t *testing.T) {
	plain := redistest.StartN(t, 3, redistest.Config{})
	out, code := cli(t, nodesEnv(plain), "doctor", "--ttl", "1s")
	assert.Equal(t, 1, code)
	assert.Contains(t, out, "UNSAFE")
	assert.Contains(t, out, "a crash loses locks it held")

	durable := redistest.StartN(t, 3, redistest.Config{Persist: true})
	time.Sleep(1100 * time.Millisecond) // up longer than the TTL given
	out, code = cli(t, nodesEnv(durable), "doctor", "--ttl", "1s")
	assert.Zero(t, code, out)
	assert.Contains(t, out, "appendfsync always")
	assert.NotContains(t, out, "UNSAFE")
	assert.Contains(t, out, "clock skew")
}

// An RDB-only or appendfsync-everysec node forgets newer locks on a
// restart while keeping its boot marker: declaring such nodes durable is
// unsafe; with the rule sitting out every restart it is not.
func TestDoctorRefusesDurableClaimForRDBAndEverysec(t *testing.T) {
	rdb := redistest.Start(t, redistest.Config{Args: []string{"--save", "60 1"}})
	everysec := redistest.Start(t, redistest.Config{Args: []string{"--appendonly", "yes", "--appendfsync", "everysec"}})
	always := redistest.Start(t, redistest.Config{Persist: true})
	env := nodesEnv([]*redistest.Server{rdb, everysec, always})
	out, code := cli(t, env, "doctor", "--ttl", "1ms", "--max-ttl", "1s", "--durable")
	assert.Equal(t, 1, code, out)
	for _, s := range []*redistest.Server{rdb, everysec} {
		assert.Regexp(t, `UNSAFE\s+`+regexp.QuoteMeta(s.Addr)+`: declared durable`, out)
	}
	assert.Regexp(t, `ok\s+`+regexp.QuoteMeta(always.Addr)+`: appendonly with appendfsync always`, out)

	out, code = cli(t, env, "doctor", "--ttl", "1ms", "--max-ttl", "1s")
	assert.Zero(t, code, out)
	assert.Contains(t, out, "every restart of this process sits out the max TTL")
}

func TestUsageErrors(t *testing.T) {
	_, code := cli(t, "REDLEASE_NODES=", "run", "--key", "k", "--", "true")
	assert.Equal(t, exitUsage, code, "no nodes")
	_, code = cli(t, "REDLEASE_NODES=127.0.0.1:1", "run", "--", "true")
	assert.Equal(t, exitUsage, code, "no key")
	_, code = cli(t, "REDLEASE_NODES=127.0.0.1:1", "run", "--key", "k", "--strategy", "nope", "--", "true")
	assert.Equal(t, exitUsage, code, "unknown strategy")
}
