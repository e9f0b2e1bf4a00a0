package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
)

// Must-show 3: while run holds a key, inspect --json names its host, pid
// and command on every node; the metadata goes with the lock; with a
// majority down inspect says "unavailable" and exits 69, and a node that
// refuses connections is reported as such.
func TestInspectNamesTheHolder(t *testing.T) {
	servers := redistest.StartN(t, 3, redistest.Config{})
	env := nodesEnv(servers)
	done := filepath.Join(t.TempDir(), "done")
	script := `echo started; i=0; while [ ! -e ` + done + ` ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done`
	p := startCLI(t, env, "run", "--key", "settle", "--record-args", "--", "sh", "-c", script)
	require.Equal(t, "started", p.line(t, 10*time.Second))

	// A node's copy of the lock (and so its metadata) may land a moment
	// after the grant: run writes it there within holderRetry of that.
	var v keyView
	var js string
	for end := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		var code int
		js, code = cli(t, env, "inspect", "--json", "settle")
		require.Zero(t, code, js)
		v = keyView{}
		require.NoError(t, json.Unmarshal([]byte(js), &v), js)
		if !slices.ContainsFunc(v.Nodes, func(n nodeView) bool { return n.Holder == nil }) || time.Now().After(end) {
			break
		}
	}
	t.Logf("inspect --json while run holds the key (pid %d):\n%s", p.cmd.Process.Pid, js)
	assert.Equal(t, "held", v.State)
	assert.Equal(t, 3, v.Agreeing)
	require.NotNil(t, v.Holder)
	host, _ := os.Hostname()
	assert.Equal(t, host, v.Holder.Host)
	assert.Equal(t, p.cmd.Process.Pid, v.Holder.PID)
	assert.Equal(t, "sh -c "+script, v.Holder.Command)
	assert.Equal(t, v.Token, v.Holder.Token)
	assert.Len(t, v.Token, len(v.Holder.Token), "the full token")
	_, err := time.Parse(time.RFC3339Nano, v.Holder.Start)
	assert.NoError(t, err)
	for _, n := range v.Nodes {
		require.NotNil(t, n.Holder, "node %s", n.Node)
		assert.Equal(t, p.cmd.Process.Pid, n.Holder.PID)
		assert.Positive(t, n.TTLms)
	}

	out, code := cli(t, env, "inspect", "settle")
	require.Zero(t, code)
	assert.Contains(t, out, "holder: host "+host+", pid "+strconv.Itoa(p.cmd.Process.Pid))

	require.NoError(t, os.WriteFile(done, nil, 0o600))
	require.Zero(t, p.wait(t, 15*time.Second))
	for _, s := range servers {
		n, err := s.Client().Exists(t.Context(), holderKey("lock:settle")).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "metadata deleted with the release on %s", s.Addr)
	}

	servers[1].Kill()
	servers[2].Kill()
	js, code = cli(t, env, "inspect", "--json", "settle")
	assert.Equal(t, exitUnavailable, code, js)
	require.NoError(t, json.Unmarshal([]byte(js), &v), js)
	assert.Equal(t, "unavailable", v.State)
	assert.Equal(t, 1, v.Answered)
	for _, n := range v.Nodes[1:] {
		assert.Equal(t, "error", n.State)
		assert.Contains(t, n.Error, "connection refused")
	}
}

// aclUser creates a user with exactly the rights docs/redis-acl.conf
// grants, and returns its name and password.
func aclUser(t *testing.T, s *redistest.Server) (string, string) {
	t.Helper()
	conf, err := os.ReadFile("../../docs/redis-acl.conf")
	require.NoError(t, err)
	var rules []string
	for _, l := range strings.Split(string(conf), "\n") {
		if f := strings.Fields(l); len(f) > 2 && f[0] == "user" {
			rules = f[2:]
		}
	}
	require.NotEmpty(t, rules, "a user line in docs/redis-acl.conf")
	for i, r := range rules {
		if strings.HasPrefix(r, ">") {
			rules[i] = ">pw"
		}
	}
	args := []any{"ACL", "SETUSER", "locker"}
	for _, r := range rules {
		args = append(args, r)
	}
	require.NoError(t, s.Client().Do(t.Context(), args...).Err())
	return "locker", "pw"
}

// With only the rights docs/redis-acl.conf grants, run writes and deletes
// its holder metadata and inspect reads it.
func TestHolderMetadataWithTheDocumentedACL(t *testing.T) {
	s := redistest.Start(t, redistest.Config{})
	user, pw := aclUser(t, s)
	env := "REDLEASE_NODES=" + s.Addr
	creds := []string{"--user", user, "--password", pw}
	done := filepath.Join(t.TempDir(), "done")
	script := `echo started; i=0; while [ ! -e ` + done + ` ] && [ $i -lt 500 ]; do sleep 0.02; i=$((i+1)); done`
	p := startCLI(t, env, append(append([]string{"run", "--key", "acl"}, creds...), "--", "sh", "-c", script)...)
	require.Equal(t, "started", p.line(t, 10*time.Second))

	js, code := cli(t, env, append(append([]string{"inspect", "--json"}, creds...), "acl")...)
	require.Zero(t, code, js)
	var v keyView
	require.NoError(t, json.Unmarshal([]byte(js), &v), js)
	assert.Equal(t, "held", v.State)
	assert.Empty(t, v.Nodes[0].Error)
	require.NotNil(t, v.Holder, "the holder, read with the documented rights")
	assert.Equal(t, p.cmd.Process.Pid, v.Holder.PID)

	require.NoError(t, os.WriteFile(done, nil, 0o600))
	require.Zero(t, p.wait(t, 15*time.Second))
	n, err := s.Client().Exists(t.Context(), holderKey("lock:acl")).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "the metadata deleted with the release, with the documented rights")
}
