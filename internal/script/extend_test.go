package script_test

import (
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
)

// ttlCase is a lock key's state before a script that extends or refreshes
// it, and what the key must look like after.
type ttlCase struct {
	name   string
	holder string        // "" absent
	ttl    time.Duration // the key's TTL before; 0: none
	ask    time.Duration // the TTL the script is sent
	held   bool          // the script must report the key as ours
	// the key's life after, from the moment set up or extended: its TTL
	// before (kept) or the one asked (raised); -1 ns: no expiry, -2 ns:
	// absent
	want time.Duration
}

const me = "tok_M.1"

// ttlCases: our key with a longer TTL keeps it (a late, shorter extension
// must not cut it back), with a shorter one is raised, without one gets
// the TTL asked; another token's key is untouched, with or without a TTL;
// an absent key is not created.
var ttlCases = []ttlCase{
	{name: "ours, longer left: kept", holder: me, ttl: time.Minute, ask: 10 * time.Second, held: true, want: time.Minute},
	{name: "ours, shorter left: raised", holder: me, ttl: 10 * time.Second, ask: time.Minute, held: true, want: time.Minute},
	{name: "ours, the same: kept", holder: me, ttl: time.Minute, ask: time.Minute, held: true, want: time.Minute},
	{name: "ours, no expiry: given the TTL", holder: me, ask: 10 * time.Second, held: true, want: 10 * time.Second},
	{name: "another's: untouched", holder: "tok_X.1", ttl: time.Minute, ask: 2 * time.Minute, want: time.Minute},
	{name: "another's, shorter: untouched", holder: "tok_X.1", ttl: 10 * time.Second, ask: time.Minute, want: 10 * time.Second},
	{name: "another's, no expiry: untouched", holder: "tok_X.1", ask: 10 * time.Second, want: -1},
	{name: "absent: not created", ask: 10 * time.Second, want: -2},
}

// setUp writes c's key state under key.
func (c ttlCase) setUp(t *testing.T, client redis.UniversalClient, key string) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, client.Del(ctx, key).Err())
	if c.holder != "" {
		require.NoError(t, client.Set(ctx, key, c.holder, c.ttl).Err())
	}
}

// check asserts the key's state after the script: its value unchanged,
// and its expiry, by the server's clock, want after a moment between
// since (taken before the case was set up) and now: so the TTL it kept
// or the one it was given, whatever the machine's speed.
func (c ttlCase) check(t *testing.T, client redis.UniversalClient, key, what string, since time.Time) {
	t.Helper()
	ctx := t.Context()
	v, err := client.Get(ctx, key).Result()
	if c.holder == "" {
		require.ErrorIs(t, err, redis.Nil, "%s: %s", what, c.name)
	} else {
		require.NoError(t, err)
		assert.Equal(t, c.holder, v, "%s: %s: the key's value", what, c.name)
	}
	if c.want < 0 {
		d, err := client.PTTL(ctx, key).Result()
		require.NoError(t, err)
		assert.Equal(t, c.want, d, "%s: %s: PTTL", what, c.name)
		return
	}
	at, ok, err := redistest.Expiry(ctx, client, key)
	now := time.Now()
	require.NoError(t, err)
	require.True(t, ok, "%s: %s: the key has a TTL", what, c.name)
	assert.True(t, redistest.GivenBetween(at, since, now, c.want), "%s: %s: the key expires %v after the case began, want %v (the case took %v)",
		what, c.name, at.Sub(since), c.want, now.Sub(since))
}

// checkNeverShorter runs every script that extends or refreshes a lock key
// over ttlCases: Extend, ExtendMany (all cases in one call, plus a key of
// another type), and Acquire on our own key (a resent or late request),
// without a fence and with one (which it reports, not raises).
func checkNeverShorter(t *testing.T, client redis.UniversalClient) {
	ctx := t.Context()
	examined := 0
	for _, c := range ttlCases {
		const key = "ttl:extend"
		since := time.Now()
		c.setUp(t, client, key)
		v, err := script.Extend.Run(ctx, client, script.Extend.Args(key, me, c.ask.Milliseconds()))
		require.NoError(t, err)
		assert.Equal(t, c.held, v == 1, "Extend: %s: reply %d", c.name, v)
		c.check(t, client, key, "Extend", since)
		examined++
	}

	keys := make([]any, 0, len(ttlCases)+1)
	args := make([]any, 0, 2*len(ttlCases)+2)
	since := time.Now()
	for i, c := range ttlCases {
		key := "ttl:many:" + string(rune('a'+i))
		c.setUp(t, client, key)
		keys = append(keys, key)
		args = append(args, me, c.ask.Milliseconds())
	}
	require.NoError(t, client.HSet(ctx, "ttl:many:hash", "f", "v").Err())
	require.NoError(t, client.PExpire(ctx, "ttl:many:hash", time.Minute).Err())
	keys = append(keys, "ttl:many:hash")
	args = append(args, me, int64(10))
	vs, err := script.ExtendMany.RunInts(ctx, client, script.ExtendMany.LineMany(keys, args))
	require.NoError(t, err)
	require.Len(t, vs, len(ttlCases)+1)
	for i, c := range ttlCases {
		want := int64(script.NotOurs)
		if c.held {
			want = script.Extended
		}
		assert.Equal(t, want, vs[i], "ExtendMany: %s", c.name)
		c.check(t, client, keys[i].(string), "ExtendMany", since)
		examined++
	}
	assert.Equal(t, int64(script.WrongType), vs[len(ttlCases)], "ExtendMany: a hash")
	at, ok, err := redistest.Expiry(ctx, client, "ttl:many:hash")
	require.NoError(t, err)
	require.True(t, ok)
	assert.False(t, at.Add(redistest.Precision).Before(since.Add(time.Minute)), "ExtendMany: a hash's TTL untouched: it expires %v after the cases began", at.Sub(since))

	// The same in the local layout (keys in ARGV, none declared).
	triples := make([]any, 0, 3*len(ttlCases)+3)
	since = time.Now()
	for i, c := range ttlCases {
		key := "ttl:local:" + string(rune('a'+i))
		c.setUp(t, client, key)
		triples = append(triples, key, me, c.ask.Milliseconds())
	}
	triples = append(triples, "ttl:many:hash", me, int64(10))
	vs, err = script.ExtendMany.RunInts(ctx, client, script.ExtendMany.LineLocal(triples))
	require.NoError(t, err)
	require.Len(t, vs, len(ttlCases)+1)
	for i, c := range ttlCases {
		want := int64(script.NotOurs)
		if c.held {
			want = script.Extended
		}
		assert.Equal(t, want, vs[i], "ExtendMany local: %s", c.name)
		c.check(t, client, triples[3*i].(string), "ExtendMany local", since)
		examined++
	}
	assert.Equal(t, int64(script.WrongType), vs[len(ttlCases)], "ExtendMany local: a hash")

	for _, mode := range []string{script.NoFence, script.IncrFence} {
		for _, c := range ttlCases {
			if !c.held {
				continue // a free key is granted, another token's taken: not this rule
			}
			const key = "ttl:acquire"
			fk := script.MustFenceKey(key)
			since := time.Now()
			c.setUp(t, client, key)
			require.NoError(t, client.Set(ctx, fk, "7", 0).Err())
			k := any(key)
			v, err := script.Acquire.Run(ctx, client, script.Acquire.Args(k, fk, k, k, me, c.ask.Milliseconds(), mode,
				script.RuleOff, script.NotDurable, script.NoFenceTTL))
			require.NoError(t, err)
			want := int64(0)
			if mode == script.IncrFence {
				want = 7 // our own key: the fence it was granted, not a new one
			}
			assert.Equal(t, want, v, "Acquire (mode %s): %s", mode, c.name)
			c.check(t, client, key, "Acquire", since)
			examined++
		}
	}
	require.Equal(t, 3*len(ttlCases)+8, examined, "every case ran")
}

func TestNoScriptShortensAHeldKeyRedis(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{})
	checkNeverShorter(t, srv.Client())
}

// The simulator runs the scripts on miniredis: they must keep the rule
// there too.
func TestNoScriptShortensAHeldKeyMiniredis(t *testing.T) {
	m := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	checkNeverShorter(t, client)
}
