package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
)

// With --strategy failover, inspect and doctor talk to the primary the
// Sentinels name, an unknown master is a usage error, and run starts the
// Sentinel watcher: a failover stops the command at once (76).
func TestFailoverCLI(t *testing.T) {
	const master = "locks"
	primary := redistest.Start(t, redistest.Config{Persist: true})
	redistest.StartReplica(t, primary, redistest.Config{Persist: true})
	sentinels := redistest.StartSentinels(t, primary, master, 3, 2, time.Second)
	addrs := make([]string, len(sentinels))
	for i, s := range sentinels {
		addrs[i] = s.Addr
	}
	env := "REDLEASE_NODES=" + strings.Join(addrs, ",")
	fo := []string{"--strategy", "failover", "--master", master}

	_, code := cli(t, env, append([]string{"inspect", "--strategy", "failover", "--master", "nope"}, "k")...)
	assert.Equal(t, exitUsage, code, "unknown master")

	// --wait: a grant whose copy the replica has not acknowledged within
	// failover.DefaultWaitTimeout (100 ms) is refused and undone, and at
	// load 26-33 (make test beside other work) the first one was
	// ("0 of 1 replicas acknowledged within 100ms"); the CLI tries again.
	p := startCLI(t, env, append(append([]string{"run", "--key", "fo", "--wait", "15s"}, fo...), "--", "sh", "-c", "echo started; exec sleep 30")...)
	require.Equal(t, "started", p.line(t, 15*time.Second))

	js, code := cli(t, env, append(append([]string{"inspect", "--json"}, fo...), "fo")...)
	require.Zero(t, code, js)
	var v keyView
	require.NoError(t, json.Unmarshal([]byte(js), &v), js)
	assert.Equal(t, "held", v.State)
	require.Len(t, v.Nodes, 1)
	assert.Equal(t, primary.Addr, v.Nodes[0].Node, "the primary, not the Sentinels")
	require.NotNil(t, v.Holder)
	assert.Equal(t, p.cmd.Process.Pid, v.Holder.PID)

	out, _ := cli(t, env, append([]string{"doctor", "--ttl", "1ms"}, fo...)...)
	assert.Contains(t, out, primary.Addr+"  yes")
	assert.NotContains(t, out, "unknown command")

	c := sentinels[0].Client(t)
	require.NoError(t, c.Failover(t.Context(), master).Err())
	assert.Equal(t, exitLost, p.wait(t, 20*time.Second), "the watcher revoked the lock on the failover")
}
