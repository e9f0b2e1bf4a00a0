package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
)

// cliIn runs the binary with stdin and returns stdout, stderr and the
// exit code.
func cliIn(t *testing.T, env, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := cliCommand(args...)
	cmd.Env = append(os.Environ(), env)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), errOut.String(), ee.ExitCode()
	}
	require.NoError(t, err)
	return out.String(), errOut.String(), 0
}

// inspectJSON is inspect --json of key, which must exit 0.
func inspectJSON(t *testing.T, env, key string) keyView {
	t.Helper()
	js, code := cli(t, env, "inspect", "--json", key)
	require.Zero(t, code, js)
	var v keyView
	require.NoError(t, json.Unmarshal([]byte(js), &v), js)
	return v
}

// Must-show 4 from a shell: release --force revokes a lock run holds. It
// shows the holder, asks first (no answer, or "n": nothing released, exit
// 1), and with --yes deletes the token on every node; run learns at its
// next renewal, stops its command and exits 76; the fence counters are
// left as they were, so the next grant's fence is higher.
func TestReleaseForceRevokesRun(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Config{})
	env := nodesEnv(servers)
	done := filepath.Join(t.TempDir(), "done")
	script := `echo started; i=0; while [ ! -e ` + done + ` ] && [ $i -lt 1500 ]; do sleep 0.02; i=$((i+1)); done`
	p := startCLI(t, env, "run", "--key", "stuck", "--ttl", "4s", "--", "sh", "-c", script)
	require.Equal(t, "started", p.line(t, 10*time.Second))
	t.Cleanup(func() { _ = os.WriteFile(done, nil, 0o600) })
	before := inspectJSON(t, env, "stuck")
	require.Equal(t, "held", before.State)

	out, code := cli(t, env, "release", "stuck")
	assert.Equal(t, exitUsage, code, "without --force: %s", out)

	for _, answer := range []string{"", "n\n", "no\n"} {
		out, stderr, code := cliIn(t, env, answer, "release", "--force", "stuck")
		assert.Equal(t, exitNotReleased, code, "answer %q: %s%s", answer, out, stderr)
		assert.Contains(t, out, "stuck: held by "+short(before.Token), "the holder shown first")
		assert.Contains(t, stderr, "redlease: release stuck held by "+short(before.Token)+" (host ")
		assert.Contains(t, stderr, "[y/N]")
		assert.Contains(t, stderr, "not confirmed: nothing released")
		assert.Equal(t, "held", inspectJSON(t, env, "stuck").State, "answer %q: nothing released", answer)
	}

	out, stderr, code := cliIn(t, env, "", "release", "--force", "--yes", "stuck")
	require.Zero(t, code, "%s%s", out, stderr)
	t.Logf("release --force --yes:\n%s", out)
	assert.Contains(t, out, "released "+short(before.Token)+" on 3 of 3 nodes")
	assert.Equal(t, 3, strings.Count(out, "deleted"), out)
	assert.Equal(t, exitLost, p.wait(t, 15*time.Second), "run learnt at its next renewal")

	after := inspectJSON(t, env, "stuck")
	assert.Equal(t, "free", after.State)
	for i := range after.Nodes {
		assert.Equal(t, before.Nodes[i].Fence, after.Nodes[i].Fence, "the fence counter left alone on %s", after.Nodes[i].Node)
		assert.Nil(t, after.Nodes[i].Holder)
	}
	out, _, code = cliIn(t, env, "", "release", "--force", "--yes", "stuck")
	assert.Equal(t, exitNotReleased, code, "a free key: nothing to release: %s", out)
}

// The attack on an operator's release: the key changes hands between the
// look (release shows the holder and waits for the answer) and the
// confirmation. release deletes nothing, says so, and exits 1; the new
// holder keeps its lock and renews it.
func TestReleaseForceAfterTheKeyChangedHands(t *testing.T) {
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
	ctx := t.Context()
	first, err := locker.TryLock(ctx, "pay")
	require.NoError(t, err)

	cmd := cliCommand("release", "--force", "pay")
	cmd.Env = append(os.Environ(), nodesEnv(servers))
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	var out bytes.Buffer
	cmd.Stdout = &out
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	prompted := make(chan string, 1)
	go func() {
		r := bufio.NewReader(stderr)
		var seen strings.Builder
		for range 100 { // bounded: the prompt is one line
			s, err := r.ReadString(' ')
			seen.WriteString(s)
			if strings.Contains(seen.String(), "[y/N] ") || err != nil {
				break
			}
		}
		prompted <- seen.String()
		_, _ = io.Copy(io.Discard, r)
	}()
	probe := redistest.StartStallProbe(t)
	prompt := redistest.Await(t, probe, prompted, 10*time.Second, 3, "the prompt")
	require.Contains(t, prompt, "release pay held by "+short(first.Token()))

	// Meanwhile the key changes hands.
	require.NoError(t, first.Release(ctx))
	next, err := locker.TryLock(ctx, "pay")
	require.NoError(t, err)
	defer next.Release(context.Background())

	_, err = stdin.Write([]byte("y\n"))
	require.NoError(t, err)
	require.NoError(t, stdin.Close())
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	err = redistest.Await(t, probe, exited, 10*time.Second, 3, "release's exit")
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, exitNotReleased, ee.ExitCode())
	t.Logf("release after the hand-over:\n%s", out.String())
	assert.Equal(t, 3, strings.Count(out.String(), "left alone"), out.String())
	assert.Contains(t, out.String(), "now: pay: held by "+short(next.Token()))

	require.NoError(t, next.Extend(ctx, 10*time.Second), "the new holder renews")
	v := inspectJSON(t, nodesEnv(servers), "pay")
	assert.Equal(t, next.Token(), v.Token)
	assert.Equal(t, "held", v.State)
}

// release says 69 when too few nodes answer to tell free from held, and
// deletes nothing.
func TestReleaseForceUnavailable(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Config{})
	env := nodesEnv(servers)
	servers[1].Kill()
	servers[2].Kill()
	out, _, code := cliIn(t, env, "", "release", "--force", "--yes", "--token", "x.1", "k")
	assert.Equal(t, exitUnavailable, code, out)
	assert.Contains(t, out, "k: unavailable: 1 of 3 nodes answered, 2 needed")
}
