package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
)

// The table is in run's help and, word for word, in the package doc.
func TestExitTableDocumented(t *testing.T) {
	src, err := os.ReadFile("main.go")
	require.NoError(t, err)
	assert.Contains(t, string(src), exitTableText("//\t"), "main.go's package doc repeats exitTable")
	help, code := cli(t, "", "run", "--help")
	require.Zero(t, code)
	assert.Contains(t, help, exitTableText("  "), "run --help shows exitTable")
}

// Must-show 2: every row of the exit-code table, from a real process. 76
// (lost) is TestMajorityKilledStopsTheCommand's and
// TestLossKillsTheWholeGroup's; 70 (internal error) is
// TestInternalErrorExitCode's.
func TestExitCodes(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Config{})
	env := nodesEnv(servers)
	down := "REDLEASE_NODES=" + redistest.DownAddr(t)
	majorityDown := "REDLEASE_NODES=" + servers[0].Addr + "," + redistest.DownAddr(t) +
		"," + redistest.DownAddr(t)
	probe := redistest.StartStallProbe(t)
	notExec := filepath.Join(t.TempDir(), "script.sh")
	require.NoError(t, os.WriteFile(notExec, []byte("#!/bin/sh\necho ran\n"), 0o600))

	rows := []struct {
		name string
		env  string
		args []string
		want int
	}{
		{"0 success", env, []string{"run", "--key", "x", "--", "true"}, 0},
		{"1-125 the command's status", env, []string{"run", "--key", "x", "--", "sh", "-c", "exit 3"}, 3},
		{"64 no nodes", "REDLEASE_NODES=", []string{"run", "--key", "x", "--", "true"}, exitUsage},
		{"64 garbage node list", "REDLEASE_NODES=garbage", []string{"run", "--key", "x", "--", "true"}, exitUsage},
		{"64 port out of range", "REDLEASE_NODES=127.0.0.1:70000", []string{"inspect", "x"}, exitUsage},
		{"64 no key", env, []string{"run", "--", "true"}, exitUsage},
		{"64 unknown strategy", env, []string{"run", "--key", "x", "--strategy", "nope", "--", "true"}, exitUsage},
		{"64 zero TTL", env, []string{"run", "--key", "x", "--ttl", "0s", "--", "true"}, exitUsage},
		{"64 negative TTL", env, []string{"run", "--key", "x", "--ttl", "-1s", "--", "true"}, exitUsage},
		{"64 negative wait", env, []string{"run", "--key", "x", "--wait", "-1s", "--", "true"}, exitUsage},
		{"64 negative grace", env, []string{"run", "--key", "x", "--grace", "-1s", "--", "true"}, exitUsage},
		{"64 grace beyond the loss margin", env, []string{"run", "--key", "x", "--grace", "10s", "--", "true"}, exitUsage},
		{"64 negative loss margin", env, []string{"run", "--key", "x", "--loss-margin", "-1s", "--", "true"}, exitUsage},
		{"64 negative max TTL", env, []string{"run", "--key", "x", "--max-ttl", "-1s", "--", "true"}, exitUsage},
		{"64 negative replicas", env, []string{"inspect", "--replicas", "-1", "x"}, exitUsage},
		{"64 zero node timeout (inspect)", env, []string{"inspect", "--node-timeout", "0s", "x"}, exitUsage},
		{"64 doctor negative TTL", env, []string{"doctor", "--ttl", "-1s"}, exitUsage},
		{"64 loss margin of half the TTL", env, []string{"run", "--key", "x", "--ttl", "2s", "--loss-margin", "1s", "--", "true"}, exitUsage},
		{"64 TTL above --max-ttl", env, []string{"run", "--key", "x", "--ttl", "2s", "--max-ttl", "1s", "--", "true"}, exitUsage},
		{"64 failover without --master", env, []string{"inspect", "--strategy", "failover", "x"}, exitUsage},
		{"69 the only node down", down, []string{"run", "--key", "x", "--", "true"}, exitUnavailable},
		{"69 a majority down", majorityDown, []string{"run", "--key", "x", "--", "true"}, exitUnavailable},
		{"69 a majority down, waiting", majorityDown, []string{"run", "--key", "x", "--wait", "300ms", "--", "true"}, exitUnavailable},
		{"69 inspect with a majority down", majorityDown, []string{"inspect", "x"}, exitUnavailable},
		{"126 not executable", env, []string{"run", "--key", "x", "--", notExec}, exitCannotExec},
		{"127 not found", env, []string{"run", "--key", "x", "--", "no-such-command-here"}, exitNotFound},
		{"128+9 the command killed by SIGKILL", env, []string{"run", "--key", "x", "--", "sh", "-c", "kill -KILL $$"}, 128 + 9},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			start := time.Now()
			out, code := cli(t, r.env, r.args...)
			assert.Equal(t, r.want, code, "stdout %q", out)
			assertWithin(t, probe, 5*time.Second, start, "exit %d", r.want)
			if r.want >= 64 && r.want < 128 {
				assert.NotContains(t, out, "ran")
			}
		})
	}

	t.Run("126 text file busy", func(t *testing.T) {
		// The script is open for writing (by this process) while run
		// starts it: execve fails with ETXTBSY, which sh reports as 126.
		script := filepath.Join(t.TempDir(), "busy.sh")
		require.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\necho ran\n"), 0o700))
		f, err := os.OpenFile(script, os.O_WRONLY|os.O_APPEND, 0)
		require.NoError(t, err)
		defer f.Close()
		out, code := cli(t, env, "run", "--key", "x", "--", script)
		assert.Equal(t, exitCannotExec, code)
		assert.Empty(t, out)
	})

	t.Run("71 no /proc: the process group cannot be started", func(t *testing.T) {
		// run starts its group leader from /proc/self/exe; in a mount
		// namespace without /proc (a bare chroot or container) it cannot.
		if os.Geteuid() != 0 {
			t.Skip("needs root for unshare -m and umount /proc")
		}
		unshare, err := exec.LookPath("unshare")
		if err != nil {
			t.Skip("no unshare(1)")
		}
		cmd := exec.Command(unshare, "-m", "sh", "-c", `umount -l /proc && exec "$0" "$@"`,
			bin, "--node-timeout", cliNodeTimeout.String(), "run", "--key", "noproc", "--", "echo", "ran")
		cmd.Env = append(os.Environ(), env)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err = cmd.Run()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "stderr %q", stderr.String())
		assert.Equal(t, exitOSErr, ee.ExitCode(), "stderr %q", stderr.String())
		assert.Contains(t, stderr.String(), "redlease: starting the command's process group: ")
		assert.Empty(t, stdout.String())
		js, code := cli(t, env, "inspect", "--json", "noproc")
		require.Zero(t, code)
		var v keyView
		require.NoError(t, json.Unmarshal([]byte(js), &v))
		assert.Equal(t, "free", v.State, "released: nothing ran")
	})

	// Output that cannot be written is an I/O error, not a success.
	for _, args := range [][]string{{"inspect", "--json", "x"}, {"inspect", "x"}, {"doctor", "--ttl", "1ms"}} {
		t.Run("74 "+strings.Join(args, " ")+" > /dev/full", func(t *testing.T) {
			full, err := os.OpenFile("/dev/full", os.O_WRONLY, 0)
			if err != nil {
				t.Skip("no /dev/full")
			}
			defer full.Close()
			cmd := cliCommand(args...)
			cmd.Env = append(os.Environ(), env)
			var stderr strings.Builder
			cmd.Stdout, cmd.Stderr = full, &stderr
			err = cmd.Run()
			var ee *exec.ExitError
			require.ErrorAs(t, err, &ee)
			assert.Equal(t, exitIOErr, ee.ExitCode())
			assert.Contains(t, stderr.String(), "no space left on device")
		})
	}

	t.Run("75 held by another", func(t *testing.T) {
		holder := startCLI(t, env, "run", "--key", "held", "--", "sh", "-c", "echo started; exec sleep 30")
		require.Equal(t, "started", holder.line(t, 10*time.Second))
		out, code := cli(t, env, "run", "--key", "held", "--", "echo", "ran")
		assert.Equal(t, exitNotObtained, code)
		assert.Empty(t, out, "the command did not run")
		out, code = cli(t, env, "run", "--key", "held", "--wait", "200ms", "--", "echo", "ran")
		assert.Equal(t, exitNotObtained, code, "within --wait")
		assert.Empty(t, out)
		holder.cmd.Process.Signal(syscall.SIGTERM)
		assert.Equal(t, 128+int(syscall.SIGTERM), holder.wait(t, 10*time.Second))
	})

	// Signals to run go to the command's whole group; the lock is released
	// before run exits with 128+signal.
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGTERM} {
		t.Run("128+"+strconv.Itoa(int(sig))+" run got "+sig.String(), func(t *testing.T) {
			marker := filepath.Join(t.TempDir(), "got")
			key := "sig" + strconv.Itoa(int(sig))
			// The command records the signal it got (a background job of
			// a non-interactive sh ignores SIGINT, so the command traps it
			// itself; the loss tests cover background processes).
			script := `trap 'echo got >> ` + marker + `; exit 0' HUP INT TERM; echo started; i=0; while [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done`
			p := startCLI(t, env, "run", "--key", key, "--", "sh", "-c", script)
			require.Equal(t, "started", p.line(t, 10*time.Second))
			require.NoError(t, p.cmd.Process.Signal(sig))
			assert.Equal(t, 128+int(sig), p.wait(t, 10*time.Second))
			got, err := os.ReadFile(marker)
			require.NoError(t, err, "the background process got the signal")
			assert.Equal(t, "got\n", string(got))
			js, code := cli(t, env, "inspect", "--json", key)
			require.Zero(t, code)
			var v keyView
			require.NoError(t, json.Unmarshal([]byte(js), &v))
			assert.Equal(t, "free", v.State, "released before run exited")
		})
	}

	t.Run("130 SIGINT while waiting for the lock", func(t *testing.T) {
		holder := startCLI(t, env, "run", "--key", "busy", "--", "sh", "-c", "echo started; exec sleep 30")
		require.Equal(t, "started", holder.line(t, 10*time.Second))
		waiter := startCLI(t, env, "run", "--key", "busy", "--wait", "20s", "--", "echo", "ran")
		// Let it start waiting: a SIGINT before run listens for it would
		// kill it by the signal. run listens before it connects, and names
		// its connections after its pid.
		name := "redlease:" + hostname(t) + ":" + strconv.Itoa(waiter.cmd.Process.Pid)
		c := servers[0].Client()
		defer c.Close()
		waitFor(t, 10*time.Second, "waiter connected", func() bool {
			list, err := c.ClientList(t.Context()).Result()
			return err == nil && strings.Contains(list, "name="+name+" ")
		})
		require.NoError(t, waiter.cmd.Process.Signal(syscall.SIGINT))
		assert.Equal(t, 130, waiter.wait(t, 10*time.Second))
		_, ok := <-waiter.lines
		assert.False(t, ok, "the command did not run")
		holder.cmd.Process.Signal(syscall.SIGTERM)
		holder.wait(t, 10*time.Second)
	})
}

func hostname(t *testing.T) string {
	h, err := os.Hostname()
	require.NoError(t, err)
	return h
}

// exec failures are told apart as a shell does.
func TestExecFailureCodes(t *testing.T) {
	_, err := exec.LookPath("no-such-command-here")
	assert.Equal(t, exitNotFound, execFailure(err))
	_, err = exec.LookPath("/etc")
	assert.Equal(t, exitCannotExec, execFailure(err))
	for _, errno := range []syscall.Errno{syscall.ENOEXEC, syscall.ETXTBSY, syscall.E2BIG, syscall.ELOOP, syscall.EACCES} {
		assert.Equal(t, exitCannotExec, execFailure(&os.PathError{Op: "fork/exec", Path: "x", Err: errno}), "%v", errno)
	}
	// A fork that fails is a system error (sysexits: "cannot fork").
	for _, errno := range []syscall.Errno{syscall.EAGAIN, syscall.ENOMEM} {
		assert.Equal(t, exitOSErr, execFailure(&os.PathError{Op: "fork/exec", Path: "x", Err: errno}), "%v", errno)
	}
}

// 70: a panic in run (a bug) is reported as an internal error; run dies,
// its group leader kills the command's group, and the lock is left to
// lapse at its TTL. The panic comes from a test seam compiled in only with
// the build tag redlease_testseam_panic (testseam_panic.go); the binary
// built without it has no such code.
func TestInternalErrorExitCode(t *testing.T) {
	t.Parallel()
	env := nodesEnv(redistest.StartN(t, 1, redistest.Config{}))
	seam := filepath.Join(t.TempDir(), "redlease-seam")
	out, err := goBuild(seam, "-tags", "redlease_testseam_panic").CombinedOutput()
	require.NoError(t, err, "%s", out)

	cmd := exec.Command(seam, "--node-timeout", cliNodeTimeout.String(), "run", "--key", "bug", "--ttl", "2s", "--", "sh", "-c", "exec sleep 30")
	cmd.Env = append(os.Environ(), env)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, exitSoftware, ee.ExitCode(), "stderr %q", stderr.String())
	assert.Contains(t, stderr.String(), "redlease: internal error (a bug in redlease; please report it): redlease_testseam_panic")

	js, code := cli(t, env, "inspect", "--json", "bug")
	require.Zero(t, code)
	var v keyView
	require.NoError(t, json.Unmarshal([]byte(js), &v))
	assert.Equal(t, "held", v.State, "not released: the group may still have been dying; the lock lapses at its TTL")
	require.NotNil(t, v.Holder)
	assert.Equal(t, cmd.Process.Pid, v.Holder.PID)
}
