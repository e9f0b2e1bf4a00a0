package redistest

import (
	"testing"

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
