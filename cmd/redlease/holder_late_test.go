package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
)

// The lock's copy on node 0 lands after the grant (a majority answered
// first; node 0's request is held in a gate until the command runs). The
// first metadata write found no key of ours there and wrote nothing; the
// holder must still show up on node 0 soon after its copy lands — not a
// third of the TTL later, at the next refresh.
func TestHolderReachesANodeWhoseCopyLandsLate(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Config{})
	gate := redistest.NewGate(t, servers[0].Addr)
	env := "REDLEASE_NODES=" + gate.Addr + "," + servers[1].Addr + "," + servers[2].Addr
	done := filepath.Join(t.TempDir(), "done")
	script := `echo started; i=0; while [ ! -e ` + done + ` ] && [ $i -lt 1000 ]; do sleep 0.02; i=$((i+1)); done`
	// 29 s: "29000" (the TTL in ms) is in the acquisition's request only.
	gate.HoldRequests("29000")
	p := startCLI(t, env, "run", "--ttl", "29s", "--key", "late", "--", "sh", "-c", script)
	require.Equal(t, "started", p.line(t, 10*time.Second))
	gate.Open() // node 0's copy of the lock lands now

	var v keyView
	deadline := time.Now().Add(3 * time.Second)
	for {
		js, code := cli(t, env, "inspect", "--json", "late")
		require.Zero(t, code, js)
		require.NoError(t, json.Unmarshal([]byte(js), &v), js)
		if len(v.Nodes) == 3 && v.Nodes[0].State == "held" && v.Nodes[0].Holder != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node 0 holds the key but names no holder 3s after its copy landed (the TTL is 29s):\n%s", js)
		}
		time.Sleep(50 * time.Millisecond)
	}
	require.NoError(t, os.WriteFile(done, nil, 0o600))
	require.Zero(t, p.wait(t, 15*time.Second))
}
