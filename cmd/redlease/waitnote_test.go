package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/redlease/redlease/internal/redistest"
)

// By default the holder record names the program only: the arguments
// (here a secret) are nowhere in it, on any node. --record-args records
// the whole line (TestInspectNamesTheHolder).
func TestHolderRecordHasNoArgumentsByDefault(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Config{})
	env := nodesEnv(servers)
	done := filepath.Join(t.TempDir(), "done")
	const secret = "--token=s3cr3t-not-for-redis"
	script := `echo started; i=0; while [ ! -e ` + done + ` ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done`
	p := startCLI(t, env, "run", "--key", "rec", "--", "sh", "-c", script, "sh", secret)
	require.Equal(t, "started", p.line(t, 10*time.Second))

	// A node's copy may land a moment after the grant: run writes the
	// record there within holderRetry; look for it (bounded) on all three.
	records := 0
	for _, s := range servers {
		c := s.Client()
		var rec map[string]string
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			var err error
			rec, err = c.HGetAll(t.Context(), holderKey("lock:rec")).Result()
			require.NoError(t, err)
			if len(rec) > 0 {
				break
			}
		}
		require.NotEmpty(t, rec, "the holder record on %s", s.Addr)
		records++
		assert.Equal(t, "sh", rec["command"], "the program only")
		assert.Equal(t, strconv.Itoa(p.cmd.Process.Pid), rec["pid"])
		for field, v := range rec {
			assert.NotContains(t, v, "s3cr3t", "field %s", field)
			assert.NotContains(t, v, "-c", "field %s: no argument", field)
		}
	}
	assert.Equal(t, len(servers), records, "records examined")
	require.NoError(t, os.WriteFile(done, nil, 0o600))
	require.Zero(t, p.wait(t, 15*time.Second))
}

// Exit 75 names the holder: its host, its pid and its program; without a
// terminal the wait says so in plain lines, never with "\r".
func TestNotObtainedNamesTheHolder(t *testing.T) {
	env := nodesEnv(redistest.StartN(t, 3, redistest.Config{}))
	holder := startCLI(t, env, "run", "--key", "held", "--", "sh", "-c", "echo started; exec sleep 30")
	require.Equal(t, "started", holder.line(t, 10*time.Second))
	want := "host " + hostname(t) + " pid " + strconv.Itoa(holder.cmd.Process.Pid) + " (sh, since "
	for _, args := range [][]string{
		{"run", "--key", "held", "--", "echo", "ran"},
		{"run", "--key", "held", "--wait", "300ms", "--", "echo", "ran"},
	} {
		stderr, code := cliStderr(t, env, args...)
		t.Logf("%v: exit %d, stderr %q", args, code, stderr)
		assert.Equal(t, exitNotObtained, code)
		assert.Contains(t, stderr, `lock "held" held by `+want, "%v", args)
		assert.NotContains(t, stderr, "\r", "%v: not a terminal", args)
	}
	require.NoError(t, holder.cmd.Process.Signal(syscall.SIGTERM))
	holder.wait(t, 10*time.Second)
}

// openPTY returns a pseudo-terminal's two ends.
func openPTY(t *testing.T) (ptm, pts *os.File) {
	t.Helper()
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { _ = ptm.Close() })
	var unlock int32
	_, _, e := unix.Syscall(unix.SYS_IOCTL, ptm.Fd(), unix.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock)))
	require.Zero(t, e, "unlockpt")
	n, err := unix.IoctlGetUint32(int(ptm.Fd()), unix.TIOCGPTN)
	require.NoError(t, err, "ptsname")
	pts, err = os.OpenFile("/dev/pts/"+strconv.Itoa(int(n)), os.O_RDWR|unix.O_NOCTTY, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pts.Close() })
	return ptm, pts
}

// On a terminal, --wait shows who holds the lock and how long run has
// waited, redrawn in place ("\r", no new line), and clears it when the
// wait ends (here by SIGINT, once two notes are on screen).
func TestWaitShowsTheHolderOnATerminal(t *testing.T) {
	ptm, pts := openPTY(t)
	env := nodesEnv(redistest.StartN(t, 3, redistest.Config{}))
	holder := startCLI(t, env, "run", "--key", "busy", "--", "sh", "-c", "echo started; exec sleep 30")
	require.Equal(t, "started", holder.line(t, 10*time.Second))
	note := "\rredlease: waiting for lock \"busy\" held by host " + hostname(t) + " pid " + strconv.Itoa(holder.cmd.Process.Pid) + " (sh, since "

	var (
		mu  sync.Mutex
		out bytes.Buffer
	)
	screen := func() string { mu.Lock(); defer mu.Unlock(); return out.String() }
	read := make(chan struct{})
	go func() { // the terminal's screen, until ptm closes
		defer close(read)
		buf := make([]byte, 4096)
		for {
			n, err := ptm.Read(buf)
			mu.Lock()
			out.Write(buf[:n])
			mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	waiter := startCLIStderr(t, env, pts, "run", "--key", "busy", "--wait", "60s", "--", "echo", "ran")
	waitFor(t, 20*time.Second, "two notes on the terminal", func() bool { return strings.Count(screen(), note) >= 2 })
	require.NoError(t, waiter.cmd.Process.Signal(syscall.SIGINT))
	assert.Equal(t, 130, waiter.wait(t, 15*time.Second))
	waitFor(t, 5*time.Second, "the exit line on the terminal", func() bool { return strings.Contains(screen(), "the command did not run") })
	_ = pts.Close()
	_ = ptm.Close()
	<-read
	got := screen()
	t.Logf("the terminal got %q", got)
	assert.Contains(t, got, "s of --wait 1m0s\x1b[K", "how long it waited, out of --wait")
	assert.Regexp(t, `\): [1-9][0-9]*s of --wait`, got, "a later note says a later time")
	first := strings.Index(got, note)
	clear := strings.LastIndex(got, "\r\x1b[K")
	require.GreaterOrEqual(t, first, 0)
	require.Greater(t, clear, first, "the note is cleared when the wait ends")
	assert.NotContains(t, got[first:clear], "\n", "redrawn in place, on one line")
	require.NoError(t, holder.cmd.Process.Signal(syscall.SIGTERM))
	holder.wait(t, 10*time.Second)
}

// The note's two forms: a line redrawn in place on a terminal, a plain
// line otherwise.
func TestWaitNoteLine(t *testing.T) {
	n := &waitNote{key: "k", wait: 10 * time.Second}
	plain := n.line("host h pid 1 (sh, since x)", 3200*time.Millisecond)
	assert.Equal(t, "redlease: waiting for lock \"k\" held by host h pid 1 (sh, since x): 3s of --wait 10s\n", plain)
	n.tty = true
	tty := n.line("host h pid 1 (sh, since x)", 3200*time.Millisecond)
	assert.Equal(t, "\r"+strings.TrimSuffix(plain, "\n")+"\x1b[K", tty)

	// Not a terminal: nothing within a wait shorter than plainEvery, and
	// stop returns at once.
	var buf bytes.Buffer
	calls := 0
	stop := startWaitNote(&buf, false, "k", time.Minute, func(context.Context) string { calls++; return "x" })
	stop()
	assert.Empty(t, buf.String())
	assert.Zero(t, calls, "no question to the nodes before a note is due")
}
