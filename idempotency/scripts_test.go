package idempotency

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
)

// The reference: the claim as it was first written, composed of the
// record's scripts and the single strategy's Acquire, unchanged, as local
// functions. claimLockScript is written out by hand, for speed, and must
// do to the record, the lock and its fence counter exactly what this
// does, and answer the same. It leaves out only what the store lock never
// uses: fair mode's line (the Barrier's Locker is never fair, so the line
// never exists).
var (
	refClaimLock = script.New(3, fn("peek", peekSrc)+`
local st = peek({KEYS[1]}, {ARGV[4]})
if st[1] == 'done' then return 'd' .. (st[2] or '') .. ':' .. st[3] end
if st[1] == 'mismatch' then return 'm' end
`+fn("acquire", script.Acquire.Source())+`
local f = acquire({KEYS[2], KEYS[3], KEYS[2], KEYS[2]}, {ARGV[1], ARGV[2], '`+script.IncrFence+`', '`+script.RuleOff+`', '`+script.NotDurable+`', ARGV[3]})
if f < 0 then return f end
`+fn("claim", claimSrc)+`
local c = claim({KEYS[1]}, {ARGV[1], string.format('%d', f), ARGV[4], ARGV[5], ARGV[6]})
if c[1] == 'claimed' then return f end
if c[1] == 'progress' then return 'p' .. string.format('%d', f) end
return redis.error_reply('idempotency: unexpected claim answer ' .. tostring(c[1]))
`)
)

// equivKeys are one copy of a request's keys: the record, the lock, the
// lock's fence counter.
type equivKeys struct{ rec, lock, fence string }

func newEquivKeys(side string, n int) equivKeys {
	lock := fmt.Sprintf("eq:%s:%d:l", side, n)
	return equivKeys{rec: fmt.Sprintf("eq:%s:%d:r", side, n), lock: lock, fence: script.MustFenceKey(lock)}
}

// equivState is a starting state of a request's keys.
type equivState struct {
	rec      []any         // HSET field-value pairs; nil: no record
	recTTL   time.Duration // 0: none
	lock     string        // "": free
	lockTTL  time.Duration // 0: none (a key set by hand)
	fence    string        // "": no counter
	fenceTTL time.Duration // 0: none
}

func (st equivState) apply(t *testing.T, c *redis.Client, k equivKeys) {
	t.Helper()
	ctx := t.Context()
	if st.rec != nil {
		require.NoError(t, c.HSet(ctx, k.rec, st.rec...).Err())
		if st.recTTL > 0 {
			require.NoError(t, c.PExpire(ctx, k.rec, st.recTTL).Err())
		}
	}
	if st.lock != "" {
		require.NoError(t, c.Set(ctx, k.lock, st.lock, st.lockTTL).Err())
	}
	if st.fence != "" {
		require.NoError(t, c.Set(ctx, k.fence, st.fence, st.fenceTTL).Err())
	}
}

// snapshot is everything a script may have changed. Expiries are kept
// apart (see sameState): the two copies are set up and run apart.
func snapshot(t *testing.T, c *redis.Client, k equivKeys) (state map[string]any, lives [3]expiry) {
	t.Helper()
	ctx := t.Context()
	life := func(key string) expiry {
		at, ok, err := redistest.Expiry(ctx, c, key)
		require.NoError(t, err)
		if ok {
			return expiry{at: at}
		}
		d, err := c.PTTL(ctx, key).Result()
		require.NoError(t, err)
		require.Negative(t, d, "%s: Expiry found no TTL", key)
		return expiry{code: d}
	}
	rec, err := c.HGetAll(ctx, k.rec).Result()
	require.NoError(t, err)
	lock, err := c.Get(ctx, k.lock).Result()
	if err == redis.Nil {
		lock = "(none)"
	} else {
		require.NoError(t, err)
	}
	fence, err := c.Get(ctx, k.fence).Result()
	if err == redis.Nil {
		fence = "(none)"
	} else {
		require.NoError(t, err)
	}
	if f, ok := rec["fence"]; ok {
		rec["fence"] = clockFence(f)
	}
	return map[string]any{"rec": rec, "lock": lock, "fence": clockFence(fence)}, [3]expiry{life(k.rec), life(k.lock), life(k.fence)}
}

// expiry is when a key expires by the server's clock (at), or, for a key
// without one, PTTL's code (code: -1 ns no TTL, -2 ns no key).
type expiry struct {
	at   time.Time
	code time.Duration
}

// clockFence replaces a fence read from the server's clock (a counter
// created anew starts at TIME in µs: see script.FenceTTL) with "clock",
// since the two copies read the clock microseconds apart; any other value
// is returned as it is.
func clockFence(v string) string {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 1e12 {
		return "clock"
	}
	return v
}

// sameState asserts that the keys of ref and got hold the same values,
// and the same lives: both none (or both no key), or expiring at most
// span apart, span being how long the two copies took from the first
// one's set-up to the second one's script (each TTL was set in that
// stretch, by the set-up or the script).
func sameState(t *testing.T, c *redis.Client, ref, got equivKeys, name string, span time.Duration) {
	t.Helper()
	rs, rt := snapshot(t, c, ref)
	gs, gt := snapshot(t, c, got)
	assert.Equal(t, rs, gs, name)
	for i, what := range []string{"record", "lock", "fence counter"} {
		if rt[i].code != 0 || gt[i].code != 0 {
			assert.Equal(t, rt[i].code, gt[i].code, "%s: the %s's TTL", name, what)
			continue
		}
		d := rt[i].at.Sub(gt[i].at).Abs()
		assert.LessOrEqual(t, d, span+2*redistest.Precision, "%s: the %s's expiries are %v apart; both copies were set up and run within %v", name, what, d, span)
	}
}

// The hand-written claimLockScript against the reference, from every
// starting state that matters to it: no record, a record in progress
// (ours, another owner's of a lower, equal or higher fence, without its
// fingerprint), completed (ok, err, big), or of another payload; a lock
// free, ours (with a TTL shorter or longer than the one asked, or without
// one), another's (with a TTL or without one), an earlier or later
// attempt of the same acquisition, another base; a fence counter absent,
// with a TTL longer or shorter than the one asked, or without one. Both
// run on two copies of the same state; replies and the resulting keys
// must be equal.
func TestHandWrittenClaimDoesWhatTheComposedOneDoes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Config{})
	c := srv.Client()
	ctx := t.Context()

	const token = "tok_A.2"
	recs := map[string][]any{
		"none":              nil,
		"progress mine":     {"state", "p", "owner", token, "fence", "5", "fp", "fpA"},
		"progress lower":    {"state", "p", "owner", "other.1", "fence", "3", "fp", "fpA"},
		"progress higher":   {"state", "p", "owner", "other.1", "fence", "99", "fp", "fpA"},
		"progress equal":    {"state", "p", "owner", "other.1", "fence", "8", "fp", "fpA"},
		"progress no fp":    {"state", "p", "owner", "other.1", "fence", "3", "fp", ""},
		"progress other fp": {"state", "p", "owner", "other.1", "fence", "3", "fp", "fpB"},
		"progress same ls":  {"state", "p", "owner", "other.1", "fence", "3", "fp", "fpA", "ls", "store"},
		"progress other ls": {"state", "p", "owner", "other.1", "fence", "3", "fp", "fpA", "ls", "quorum a,b,c"},
		"progress mine ls":  {"state", "p", "owner", token, "fence", "5", "fp", "fpA", "ls", "quorum a,b,c"},
		"done ok":           {"state", "c", "owner", "other.1", "fence", "3", "fp", "fpA", "kind", "ok", "result", "paid:1"},
		"done err":          {"state", "c", "owner", "other.1", "fence", "3", "fp", "", "kind", "err", "result", "declined"},
		"done big":          {"state", "c", "owner", token, "fence", "3", "fp", "fpA", "kind", "big"},
		"done other fp":     {"state", "c", "owner", "other.1", "fence", "3", "fp", "fpB", "kind", "ok", "result", "x"},
	}
	locks := map[string]struct {
		v   string
		ttl time.Duration
	}{
		"free":          {},
		"mine":          {token, 20 * time.Second},
		"mine longer":   {token, time.Minute}, // longer than the 30 s asked: kept
		"mine no ttl":   {token, 0},
		"other":         {"other.1", 20 * time.Second},
		"other no ttl":  {"other.1", 0},
		"earlier mine":  {"tok_A.1", 20 * time.Second},
		"later mine":    {"tok_A.3", 20 * time.Second},
		"other base":    {"tok_B.1", 20 * time.Second},
		"not a pattern": {"plain", 20 * time.Second},
	}
	fences := map[string]struct {
		v   string
		ttl time.Duration
	}{
		"none":    {},
		"longer":  {"7", time.Hour},
		"shorter": {"7", 10 * time.Second},
		"no ttl":  {"7", 0},
	}
	fps := []string{"", "fpA"}

	n := 0
	for rn, rec := range recs {
		for ln, lock := range locks {
			for fn, fence := range fences {
				for _, fp := range fps {
					n++
					name := fmt.Sprintf("claim/rec=%s/lock=%s/fence=%s/fp=%q", rn, ln, fn, fp)
					st := equivState{rec: rec, recTTL: time.Hour, lock: lock.v, lockTTL: lock.ttl, fence: fence.v, fenceTTL: fence.ttl}
					ref, got := newEquivKeys("ref", n), newEquivKeys("got", n)
					began := time.Now()
					st.apply(t, c, ref)
					st.apply(t, c, got)
					args := func(k equivKeys, s *script.Script) []any {
						return s.Args(k.rec, k.lock, k.fence, token, int64(30_000), int64(60_000), fp, int64(120_000), "store")
					}
					refReply, refErr := refClaimLock.RunValue(ctx, c, args(ref, refClaimLock))
					gotReply, gotErr := claimLockScript.RunValue(ctx, c, args(got, claimLockScript))
					span := time.Since(began)
					assert.Equal(t, fmt.Sprint(refErr), fmt.Sprint(gotErr), name)
					sameReply(t, refReply, gotReply, name)
					sameState(t, c, ref, got, name, span)
				}
			}
		}
	}

}

// sameReply asserts that two claim replies are equal, except that two
// refusals may carry remaining TTLs a second apart (the two copies run
// milliseconds apart).
func sameReply(t *testing.T, ref, got any, name string) {
	t.Helper()
	r, rok := ref.(int64)
	g, gok := got.(int64)
	if rok && gok && script.IsTaken(r) && script.IsTaken(g) {
		rd, rhas := script.Remaining(r)
		gd, ghas := script.Remaining(g)
		assert.Equal(t, rhas, ghas, "%s: a refusal with a TTL, or without", name)
		assert.InDelta(t, rd.Seconds(), gd.Seconds(), 1, "%s: the holder's TTL", name)
		return
	}
	assert.Equal(t, clockReply(ref), clockReply(got), name)
}

// clockReply is a claim reply with a fence read from the server's clock
// replaced as clockFence replaces it.
func clockReply(v any) any {
	switch v := v.(type) {
	case int64:
		return clockFence(strconv.FormatInt(v, 10))
	case string:
		if strings.HasPrefix(v, "p") {
			return "p" + clockFence(v[1:])
		}
	}
	return v
}

// The claim's own-token branch (a resent claim whose first reply was
// lost, or a late copy) never shortens the lock key, as script.Acquire's:
// a longer TTL is kept, a shorter one raised, a key without one given
// the lease; another token's key is untouched.
func TestClaimNeverShortensItsOwnLock(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	c := srv.Client()
	ctx := t.Context()
	const token = "tok_A.2"
	cases := []struct {
		name    string
		holder  string
		ttl     time.Duration
		granted bool
		want    time.Duration // the lock's life after, from its set-up or the claim
	}{
		{"mine, longer left: kept", token, time.Minute, true, time.Minute},
		{"mine, shorter left: raised", token, 10 * time.Second, true, 30 * time.Second},
		{"mine, no expiry: given the lease", token, 0, true, 30 * time.Second},
		{"another's, longer: untouched", "other.1", time.Minute, false, time.Minute},
		{"another's, shorter: untouched", "other.1", 10 * time.Second, false, 10 * time.Second},
	}
	for i, tc := range cases {
		k := newEquivKeys("own", i)
		since := time.Now()
		equivState{lock: tc.holder, lockTTL: tc.ttl, fence: "7", fenceTTL: time.Hour}.apply(t, c, k)
		reply, err := claimLockScript.RunValue(ctx, c, claimLockScript.Args(k.rec, k.lock, k.fence, token, int64(30_000), int64(60_000), "", int64(120_000), "store"))
		require.NoError(t, err, tc.name)
		v, ok := reply.(int64)
		require.True(t, ok, "%s: reply %v", tc.name, reply)
		assert.Equal(t, tc.granted, !script.IsTaken(v), "%s: reply %d", tc.name, v)
		held, err := c.Get(ctx, k.lock).Result()
		require.NoError(t, err)
		assert.Equal(t, tc.holder, held, tc.name)
		// By the server's clock, whatever the machine's speed: tc.want
		// after a moment between since and now.
		at, ok, err := redistest.Expiry(ctx, c, k.lock)
		now := time.Now()
		require.NoError(t, err)
		require.True(t, ok, "%s: the lock has a TTL", tc.name)
		assert.True(t, redistest.GivenBetween(at, since, now, tc.want),
			"%s: the lock expires %v after the case began, want %v (the case took %v)", tc.name, at.Sub(since), tc.want, now.Sub(since))
	}
}
