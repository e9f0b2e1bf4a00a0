package main

import (
	"bufio"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
)

// proc is a `redlease` process started in the background.
type proc struct {
	cmd   *exec.Cmd
	lines chan string // stdout, line by line; closed at EOF
	done  chan struct{}
	code  int
}

// startCLI starts the binary and returns at once; t.Cleanup kills it if
// it is still running.
func startCLI(t *testing.T, env string, args ...string) *proc {
	t.Helper()
	return startCLIStderr(t, env, os.Stderr, args...)
}

// startCLIStderr is startCLI with the process's stderr on stderr.
func startCLIStderr(t *testing.T, env string, stderr *os.File, args ...string) *proc {
	t.Helper()
	cmd := cliCommand(args...)
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &proc{cmd: cmd, lines: make(chan string, 100), done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		err := cmd.Wait()
		var ee *exec.ExitError
		switch {
		case errors.As(err, &ee):
			p.code = ee.ExitCode()
			if ws, ok := ee.Sys().(interface{ Signaled() bool }); ok && ws.Signaled() {
				p.code = -1
			}
		case err != nil:
			p.code = -2
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
	})
	return p
}

// line waits for the next stdout line: for d plus 3 × what a probe
// measured this process stalled meanwhile (redistest.StallProbe.WaitFor).
func (p *proc) line(t *testing.T, d time.Duration) string {
	t.Helper()
	probe := redistest.StartStallProbe(t)
	defer probe.Stop()
	var l string
	var ok, got bool
	probe.WaitFor(t, d, 3, time.Millisecond, func() bool {
		select {
		case l, ok = <-p.lines:
			got = true
		default:
		}
		return got
	}, "no line on stdout")
	require.True(t, ok, "stdout closed")
	return l
}

// wait waits for the process to exit and returns its exit code: for d
// plus 3 × what a probe measured this process stalled meanwhile
// (redistest.Await).
func (p *proc) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	probe := redistest.StartStallProbe(t)
	defer probe.Stop()
	redistest.Await(t, probe, p.done, d, 3, "still running")
	return p.code
}

// waitFor polls cond every 10 ms, for d plus 3 × what a probe measured
// this process stalled meanwhile (redistest.StallProbe.WaitFor).
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	probe := redistest.StartStallProbe(t)
	defer probe.Stop()
	probe.WaitFor(t, d, 3, 10*time.Millisecond, cond, "%s", what)
}

// writerScript starts a background loop that appends "A <ns>" to file
// every 20 ms, ignoring SIGTERM (only SIGKILL stops it), then waits.
func writerScript(file string) string {
	return `trap '' TERM; (trap '' TERM; while :; do echo "A $(date +%s%N)" >> ` + file +
		`; sleep 0.02; done) & echo started; wait`
}

// secondHolder is the next holder's command: it marks its start, then
// gives the first holder's group half a second to show itself.
func secondHolder(file string) string {
	return `echo "B $(date +%s%N) start" >> ` + file + `; sleep 0.5; echo "B $(date +%s%N) end" >> ` + file
}

// checkNoWriteAfter asserts that no "A" line follows the first "B" line,
// and returns how many A lines came before it and the gap between the last
// A and the B start.
func checkNoWriteAfter(t *testing.T, file string) (int, time.Duration) {
	t.Helper()
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	bAt, lastA := -1, int64(0)
	as := 0
	for i, l := range lines {
		f := strings.Fields(l)
		require.GreaterOrEqual(t, len(f), 2, "line %q", l)
		ns, err := strconv.ParseInt(f[1], 10, 64)
		require.NoError(t, err)
		switch {
		case f[0] == "B" && bAt < 0:
			bAt = i
			require.Greater(t, ns, lastA, "the second holder started before the first holder's last write")
		case f[0] == "A" && bAt >= 0:
			t.Errorf("write from the first holder's group after the second holder started: line %d %q (B started at line %d)", i, l, bAt)
		case f[0] == "A":
			as++
			lastA = ns
		}
	}
	require.GreaterOrEqual(t, bAt, 0, "the second holder never ran")
	require.Positive(t, as, "the first holder's group never wrote")
	start, _ := strconv.ParseInt(strings.Fields(lines[bAt])[1], 10, 64)
	return as, time.Duration(start - lastA)
}

// loseToASecondHolder makes the first holder of "money" lose its lock:
// every node is SIGSTOPped past ttl, so that its keys have expired on
// every node by the time they run again. A second holder then takes the
// key and runs to completion; the first holder's group must have written
// nothing after it started (checkNoWriteAfter, whose figures it returns).
func loseToASecondHolder(t *testing.T, servers []*redistest.Server, env, file string, ttl time.Duration) (int, time.Duration) {
	t.Helper()
	for _, s := range servers {
		s.Pause()
	}
	paused := time.Now()
	time.Sleep(ttl + 200*time.Millisecond - time.Since(paused))
	for _, s := range servers {
		s.Resume()
	}
	second := startCLI(t, env, "run", "--key", "money", "--wait", "10s", "--", "sh", "-c", secondHolder(file))
	assert.Equal(t, 0, second.wait(t, 20*time.Second), "second holder")
	return checkNoWriteAfter(t, file)
}

// Must-show 1: the lock is lost (every node SIGSTOPped past the TTL); the
// first holder's whole group — a shell ignoring SIGTERM and its background
// loop — is killed before the second holder's command starts.
func TestLossKillsTheWholeGroup(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Config{})
	env := nodesEnv(servers)
	file := filepath.Join(t.TempDir(), "writes")
	const ttl = 2 * time.Second
	first := startCLI(t, env, "run", "--key", "money", "--ttl", ttl.String(), "--", "sh", "-c", writerScript(file))
	require.Equal(t, "started", first.line(t, 10*time.Second))
	waitFor(t, 5*time.Second, "first writes", func() bool { fi, err := os.Stat(file); return err == nil && fi.Size() > 0 })

	n, gap := loseToASecondHolder(t, servers, env, file, ttl)
	assert.Equal(t, exitLost, first.wait(t, 20*time.Second), "first holder: lost")
	t.Logf("lock lost: %d writes by the first holder's group, none after the second holder started; the last %v before it", n, gap)
}

// The loss line goes to a stderr nobody reads (a log pipe that is full):
// writing it must not hold back the SIGKILL of a group that ignores
// SIGTERM. The command fills the pipe itself (70,000 bytes into a
// 64 KiB pipe, from a background process of the group) before the loss.
func TestLossKillsTheGroupWhileStderrIsBlocked(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Config{})
	env := nodesEnv(servers)
	file := filepath.Join(t.TempDir(), "writes")
	r, w, err := os.Pipe()
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close(); _ = w.Close() })
	const ttl = 2 * time.Second
	fill := `(head -c 70000 /dev/zero >&2 &); ` + writerScript(file)
	first := startCLIStderr(t, env, w, "run", "--key", "money", "--ttl", ttl.String(), "--", "sh", "-c", fill)
	require.Equal(t, "started", first.line(t, 10*time.Second))
	waitFor(t, 5*time.Second, "first writes", func() bool { fi, err := os.Stat(file); return err == nil && fi.Size() > 0 })

	n, gap := loseToASecondHolder(t, servers, env, file, ttl)
	t.Logf("lock lost with stderr blocked: %d writes by the first holder's group, none after the second holder started; the last %v before it", n, gap)
	// Unblock stderr so that run can finish.
	go func() { _, _ = io.Copy(io.Discard, r) }()
	assert.Equal(t, exitLost, first.wait(t, 20*time.Second), "first holder: lost")
}

// Must-show 1, again with run itself SIGKILLed: its group leader notices
// (Pdeathsig) and kills the group; the lock lapses at its TTL and the next
// holder finds nobody writing.
func TestRunKilledTakesItsGroupAlong(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Config{})
	env := nodesEnv(servers)
	file := filepath.Join(t.TempDir(), "writes")
	first := startCLI(t, env, "run", "--key", "money", "--ttl", "2s", "--", "sh", "-c", writerScript(file))
	require.Equal(t, "started", first.line(t, 10*time.Second))
	waitFor(t, 5*time.Second, "first writes", func() bool { fi, err := os.Stat(file); return err == nil && fi.Size() > 0 })

	require.NoError(t, first.cmd.Process.Kill())
	assert.Equal(t, -1, first.wait(t, 5*time.Second), "killed by a signal")
	second := startCLI(t, env, "run", "--key", "money", "--wait", "10s", "--", "sh", "-c", secondHolder(file))
	assert.Equal(t, 0, second.wait(t, 20*time.Second), "second holder")
	n, gap := checkNoWriteAfter(t, file)
	t.Logf("run SIGKILLed: %d writes by the first holder's group, none after the second holder started; the last %v before it", n, gap)
}

// A command that leaves a background process behind keeps the lock until
// that process exits, as flock's inherited descriptor does.
func TestLockHeldUntilTheGroupIsGone(t *testing.T) {
	env := nodesEnv(redistest.StartN(t, 1, redistest.Config{}))
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	// The background process waits (at most 10 s) for the release file.
	script := `(i=0; while [ ! -e ` + release + ` ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done) & echo started; exit 0`
	first := startCLI(t, env, "run", "--key", "bg", "--", "sh", "-c", script)
	require.Equal(t, "started", first.line(t, 10*time.Second))

	_, code := cli(t, env, "run", "--key", "bg", "--", "true")
	assert.Equal(t, exitNotObtained, code, "the shell exited, its background process still holds the lock")
	require.NoError(t, os.WriteFile(release, nil, 0o600))
	assert.Zero(t, first.wait(t, 15*time.Second))
	_, code = cli(t, env, "run", "--key", "bg", "--", "true")
	assert.Zero(t, code, "released once the group was gone")
}
