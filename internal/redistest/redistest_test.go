package redistest

import (
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A server launched on a port another test's redis-server holds cannot
// bind it and exits, but a PING to the port is answered by the other
// server: launch must not take that answer for its own, or the test then
// drives a server it does not own (and sees it killed, restarted or
// written by the other test). Forced order: the port is taken before the
// launch.
func TestLaunchRefusesAPortAnotherServerAnswers(t *testing.T) {
	owner := Start(t, Config{})
	s := &Server{tb: t, dir: t.TempDir(), Port: owner.Port, Addr: owner.Addr}
	t.Cleanup(s.Kill)
	err := s.launch(Binary(t))
	require.Error(t, err, "launch on %s, a port another redis-server holds, reported success", owner.Addr)
	require.Contains(t, err.Error(), owner.Addr)
	require.True(t, owner.Alive(), "the other server is untouched")
}

// A down address refuses connections, and no server can take its port
// while the test runs (a FreePort can be taken: exitcodes' "a majority
// down" once reached another test's server on one).
func TestDownAddrRefusesAndCannotBeTaken(t *testing.T) {
	addr := DownAddr(t)
	_, err := net.DialTimeout("tcp", addr, time.Second)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	_, port, err := net.SplitHostPort(addr)
	require.NoError(t, err)
	p, err := strconv.Atoi(port)
	require.NoError(t, err)
	s := &Server{tb: t, dir: t.TempDir(), Port: p, Addr: addr}
	t.Cleanup(s.Kill)
	require.Error(t, s.launch(Binary(t)), "a redis-server bound the down port %s", addr)
	_, err = net.DialTimeout("tcp", addr, time.Second)
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "still down after the launch")
}

// A server that exits without Kill (a crash, a signal from elsewhere) is
// recorded with its log's tail, for cleanup to log; Kill and Restart are
// not. At load 25-33 a test's own server refused connections mid-test
// (TestDoHoldsNoGoroutineOfItsOwn) and nothing said why.
func TestServerThatExitsOnItsOwnIsRecorded(t *testing.T) {
	s := Start(t, Config{})
	s.Restart()
	s.mu.Lock()
	require.Empty(t, s.unexpected, "Restart's kill is ours")
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("redis-server did not exit on SIGTERM")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Len(t, s.unexpected, 1)
	require.Contains(t, s.unexpected[0], "exited on its own")
	require.Contains(t, s.unexpected[0], "signal", "the log's tail says how it ended")
}
