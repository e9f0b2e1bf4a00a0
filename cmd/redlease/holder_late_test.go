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
//
// How soon: run asks a node that lacked the metadata again after
// holderRetry, then twice as long each time, so a copy that lands L after
// the first write is found within L + holderRetry of landing. The first
// write came after the CLI started, so L is at most the time from then to
// the gate's opening, measured here. The window allows stallMultiple times
// what this process was measured stalled on top (the CLI runs on the same
// machine; the gate that lets the copy through runs in this process); an
// inspect that starts after the window and finds no holder fails the test.
// Before the doubling, the quick retries ended 2 s after the grant: a copy
// let through later (the gate opens once the command printed its first
// line, which under load took up to 2.1 s) waited for the next refresh,
// 9.7 s after the grant.
func TestHolderReachesANodeWhoseCopyLandsLate(t *testing.T) {
	const stallMultiple = 2
	probe := redistest.StartStallProbe(t)
	servers := redistest.StartN(t, 3, redistest.Config{})
	gate := redistest.NewGate(t, servers[0].Addr)
	env := "REDLEASE_NODES=" + gate.Addr + "," + servers[1].Addr + "," + servers[2].Addr
	done := filepath.Join(t.TempDir(), "done")
	script := `echo started; i=0; while [ ! -e ` + done + ` ] && [ $i -lt 1000 ]; do sleep 0.02; i=$((i+1)); done`
	// A run of another key first, through the open gate: node 0 caches the
	// scripts, as a node that has served before has. The held request is
	// an EVALSHA; on a node that lacks the script it gets NOSCRIPT, and
	// go-redis sends the script itself only to a caller still waiting —
	// once the CLI's wait for node 0 has ended (under load, before the
	// gate opened) the copy never landed, and node 0 stayed free.
	_, code := cli(t, env, "run", "--key", "warm", "--", "true")
	require.Zero(t, code, "a first run through the gate")
	// 29 s: "29000" (the TTL in ms) is in the acquisition's request only.
	gate.HoldRequests("29000")
	start := time.Now()
	p := startCLI(t, env, "run", "--ttl", "29s", "--key", "late", "--", "sh", "-c", script)
	require.Equal(t, "started", p.line(t, 10*time.Second))
	opened := time.Now()
	gate.Open() // node 0's copy of the lock lands now
	bound := opened.Sub(start) + holderRetry

	var v keyView
	for inspects := 1; ; inspects++ {
		asked := time.Now()
		js, code := cli(t, env, "inspect", "--json", "late")
		require.Zero(t, code, js)
		require.NoError(t, json.Unmarshal([]byte(js), &v), js)
		if len(v.Nodes) == 3 && v.Nodes[0].State == "held" && v.Nodes[0].Holder != nil {
			t.Logf("holder on node 0 by %v after its copy was let through (inspect %d; the gate opened %v after the CLI started)",
				time.Since(opened).Round(time.Millisecond), inspects, opened.Sub(start).Round(time.Millisecond))
			break
		}
		if waited := asked.Sub(opened); waited > probe.Allowance(bound, stallMultiple, opened, asked) || inspects >= 1000 {
			t.Fatalf("node 0 holds the key but names no holder in an inspect begun %v after its copy was let through (the TTL is 29s; the copy landed at most %v after the first write): %s\n%s",
				waited, opened.Sub(start), probe.Explain(bound, stallMultiple, opened, asked), js)
		}
		time.Sleep(holderRetry)
	}
	require.NoError(t, os.WriteFile(done, nil, 0o600))
	require.Zero(t, p.wait(t, 15*time.Second))
}
