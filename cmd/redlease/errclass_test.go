package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
)

// A grant the paused replica did not acknowledge is an outage: run exits
// 69 (too few nodes answered), never 75 (held by another holder), and the
// command does not run.
func TestUnacknowledgedGrantExits69(t *testing.T) {
	const master = "locks"
	primary := redistest.Start(t, redistest.Config{})
	replica := redistest.StartReplica(t, primary, redistest.Config{})
	sentinels := redistest.StartSentinels(t, primary, master, 3, 2, time.Second)
	addrs := make([]string, len(sentinels))
	for i, s := range sentinels {
		addrs[i] = s.Addr
	}
	env := "REDLEASE_NODES=" + strings.Join(addrs, ",")
	c := primary.Client()
	waitFor(t, 10*time.Second, "the replica acknowledges writes before it is paused", func() bool {
		n, err := c.Do(t.Context(), "WAIT", 1, 100).Int64()
		return err == nil && n == 1
	})

	replica.Pause()
	t.Cleanup(replica.Resume)
	stderr, code := cliStderr(t, env, "run", "--strategy", "failover", "--master", master, "--key", "paused-replica", "--", "echo", "ran")
	t.Logf("stderr: %s", stderr)
	assert.Equal(t, exitUnavailable, code)
	assert.Contains(t, stderr, "too few nodes answered")
	assert.Contains(t, stderr, "replicas acknowledged")
	assert.NotContains(t, stderr, "held by another")
	assert.Equal(t, 1, strings.Count(stderr, "redlease: "), "the prefix once")
}

// NOPERM exits 77 (EX_NOPERM) and a wrong or missing password 78
// (EX_CONFIG), at once, with the server's reply and the hint doctor gives;
// never 69 ("too few nodes answered") or 75.
func TestDeniedExitCodes(t *testing.T) {
	acl := redistest.Start(t, redistest.Config{})
	require.NoError(t, acl.Client().Do(t.Context(), "ACL", "SETUSER", "reader", "on", ">s3cret", "~*", "+@read", "+hello", "+ping").Err())
	trio := redistest.StartN(t, 3, redistest.Config{})
	for _, s := range trio {
		require.NoError(t, s.Client().ConfigSet(t.Context(), "requirepass", "right").Err())
	}
	auth := trio[0]
	probe := redistest.StartStallProbe(t)
	for _, r := range []struct {
		name  string
		env   string
		flags []string
		want  int
		reply string
	}{
		{"NOPERM", "REDLEASE_NODES=" + acl.Addr, []string{"--user", "reader", "--password", "s3cret"}, exitNoPerm, "NOPERM"},
		{"WRONGPASS", "REDLEASE_NODES=" + auth.Addr, []string{"--password", "wrong"}, exitConfig, "WRONGPASS"},
		{"NOAUTH", "REDLEASE_NODES=" + auth.Addr, nil, exitConfig, "unauthenticated"}, // Redis cuts an unauthenticated client sending the script: "ERR Protocol error: unauthenticated multibulk length"
		{"WRONGPASS quorum", nodesEnv(trio), []string{"--password", "wrong"}, exitConfig, "WRONGPASS"},
	} {
		t.Run(r.name, func(t *testing.T) {
			for _, wait := range []string{"0s", "5s"} {
				start := time.Now()
				args := append(append([]string{"run"}, r.flags...), "--key", "denied", "--wait", wait, "--", "echo", "ran")
				stderr, code := cliStderr(t, r.env, args...)
				t.Logf("--wait %s: exit %d, stderr: %s", wait, code, stderr)
				assert.Equal(t, r.want, code, "--wait %s", wait)
				assert.Contains(t, stderr, r.reply)
				assert.Contains(t, stderr, "docs/redis-acl.conf")
				assert.Contains(t, stderr, "redlease doctor")
				assert.NotContains(t, stderr, "too few nodes answered")
				assert.NotContains(t, stderr, "held by another")
				assert.Equal(t, 1, strings.Count(stderr, "redlease: "), "the prefix once")
				assertWithin(t, probe, 3*time.Second, start, "--wait %s: a denial is not waited out", wait)
			}
		})
	}
}
