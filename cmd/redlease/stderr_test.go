package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
)

// cliStderr runs the binary and returns its stderr and exit code.
func cliStderr(t *testing.T, env string, args ...string) (string, int) {
	t.Helper()
	cmd := cliCommand(args...)
	cmd.Env = append(os.Environ(), env)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil {
		require.ErrorAs(t, err, &ee)
		return stderr.String(), ee.ExitCode()
	}
	return stderr.String(), 0
}

// stderr carries redlease's own lines only, each with the redlease: prefix
// once: no go-redis log lines (its dial and pool messages), even with a
// node that refuses connections.
func TestStderrIsRedleaseOnly(t *testing.T) {
	servers := redistest.StartN(t, 2, redistest.Config{})
	env := "REDLEASE_NODES=" + servers[0].Addr + "," + servers[1].Addr + "," + redistest.DownAddr(t)
	for _, args := range [][]string{
		{"run", "--key", "x", "--", "true"},
		{"inspect", "x"},
		{"doctor", "--ttl", "1ms"},
		{"run", "--key", "x", "--prefix", "redlease:", "--", "true"}, // a usage error from the library
	} {
		stderr, code := cliStderr(t, env, args...)
		t.Logf("%v: exit %d, stderr %q", args, code, stderr)
		for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
			if l == "" {
				continue
			}
			assert.True(t, strings.HasPrefix(l, "redlease: "), "%v: a line not from redlease: %q", args, l)
			assert.False(t, strings.HasPrefix(l, "redlease: redlease:"), "%v: prefix twice: %q", args, l)
		}
	}
}
