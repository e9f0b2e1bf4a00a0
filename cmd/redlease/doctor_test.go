package main

import (
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/redlease/redlease/internal/redistest"
)

// Must-show 4: doctor on a node with allkeys-lru, one with RDB only, and a
// node list that names one server twice (once as itself, once through a
// forwarder: same run_id) and one address twice. One line per finding,
// each saying what to change.
func TestDoctorFindsWhatDeletesLocks(t *testing.T) {
	lru := redistest.Start(t, redistest.Config{Persist: true, Args: []string{"--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru"}})
	rdb := redistest.Start(t, redistest.Config{Args: []string{"--save", "60 1"}})
	fine := redistest.Start(t, redistest.Config{Persist: true})
	twin := redistest.NewGate(t, fine.Addr) // the same server under another address
	env := "REDLEASE_NODES=" + strings.Join([]string{lru.Addr, rdb.Addr, fine.Addr, twin.Addr, rdb.Addr}, ",")
	out, code := cli(t, env, "doctor", "--ttl", "1ms")
	t.Logf("redlease doctor:\n%s", out)
	assert.Equal(t, exitUnsafe, code)
	want := []string{
		`UNSAFE\s+` + regexp.QuoteMeta(lru.Addr) + `: maxmemory-policy allkeys-lru: .*set maxmemory-policy noeviction`,
		`UNSAFE\s+` + regexp.QuoteMeta(rdb.Addr) + `: RDB snapshots only \(save "60 1", appendonly no\): .*use appendonly yes \+ appendfsync always`,
		`UNSAFE\s+` + regexp.QuoteMeta(twin.Addr) + `: the same server as ` + regexp.QuoteMeta(fine.Addr) + ` \(run_id [0-9a-f]+\): .*list each node once`,
		`UNSAFE\s+` + regexp.QuoteMeta(rdb.Addr) + `: listed twice: .*list each node once`,
		`ok\s+set: clock skew between nodes`,
	}
	for _, re := range want {
		assert.Regexp(t, re, out)
	}
	assert.Regexp(t, `ok\s+`+regexp.QuoteMeta(fine.Addr)+`: appendonly with appendfsync always`, out)
	assert.NotRegexp(t, `UNSAFE\s+`+regexp.QuoteMeta(fine.Addr)+`: (maxmemory|the same server|listed twice|a probe)`, out)

	// The TTL in use against the delayed-restart max TTL.
	out, code = cli(t, "REDLEASE_NODES="+fine.Addr, "doctor", "--ttl", "1m", "--max-ttl", "30s")
	assert.Equal(t, exitUnsafe, code)
	assert.Regexp(t, `UNSAFE\s+set: the TTL in use \(--ttl 1m0s\) exceeds --max-ttl 30s: .*raise --max-ttl to at least 1m0s`, out)
}

// A user without the rights the scripts need is told so by doctor.
func TestDoctorChecksACLRights(t *testing.T) {
	s := redistest.Start(t, redistest.Config{Persist: true})
	c := s.Client()
	assert.NoError(t, c.Do(t.Context(), "ACL", "SETUSER", "weak", "on", ">pw", "~*", "+@read", "+info", "+time", "+config|get", "+client").Err())
	out, code := cli(t, "REDLEASE_NODES="+s.Addr, "doctor", "--ttl", "1ms", "--user", "weak", "--password", "pw")
	assert.Equal(t, exitUnsafe, code, out)
	assert.Regexp(t, `UNSAFE\s+`+regexp.QuoteMeta(s.Addr)+`: a probe lock under "lock:" failed: .*NOPERM.*docs/redis-acl.conf`, out)
}

// Every unsafe line says what to change, an unreachable node too.
func TestDoctorUnreachableSaysWhatToChange(t *testing.T) {
	addr := redistest.DownAddr(t)
	out, code := cli(t, "REDLEASE_NODES="+addr, "doctor")
	assert.Equal(t, exitUnsafe, code)
	assert.Regexp(t, `UNSAFE\s+`+regexp.QuoteMeta(addr)+`: unreachable: .*connection refused.*; check that redis-server runs there and the address, or remove it from --nodes`, out)
}

// Clock skew above a second is unsafe (TIME cannot be skewed on one
// redis-server here, so the rule is checked on offsets).
func TestSkewFinding(t *testing.T) {
	for _, c := range []struct {
		offsets []time.Duration
		unsafe  bool
		text    string
	}{
		{[]time.Duration{0, 3 * time.Millisecond}, false, "clock skew between nodes 3ms (TIME)"},
		{[]time.Duration{-600 * time.Millisecond, 0, 600 * time.Millisecond}, true, "clock skew between nodes 1.2s (TIME): their clocks are not disciplined, and then their rates drift too; run NTP on every node"},
	} {
		got := skewFinding(c.offsets)
		assert.Equal(t, c.unsafe, got.unsafe, "%v", c.offsets)
		assert.Equal(t, c.text, got.text)
		assert.Equal(t, "set", got.node)
	}
}
