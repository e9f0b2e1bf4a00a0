package script_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/internal/script"
)

// keyState is a lock key and its fence counter before a script runs.
type keyState struct {
	holder  string        // "" absent
	ttl     time.Duration // the holder's TTL; 0: none
	counter int64         // the fence counter; 0: absent
}

// keyStates: free, ours (a resent request), an earlier attempt of ours
// (taken over), an earlier attempt of another call, another's with and
// without a TTL; each with and without a counter.
var keyStates = func() []keyState {
	var out []keyState
	for _, h := range []keyState{
		{},
		{holder: me, ttl: 10 * time.Second},
		{holder: me, ttl: 10 * time.Minute},
		{holder: "tok_M.0", ttl: time.Minute},
		{holder: "tok_O.0", ttl: time.Minute},
		{holder: "tok_X.1", ttl: time.Minute},
		{holder: "tok_X.1"},
	} {
		for _, counter := range []int64{0, 41} {
			h.counter = counter
			out = append(out, h)
		}
	}
	return out
}()

func (s keyState) String() string {
	return fmt.Sprintf("holder %q ttl %v counter %d", s.holder, s.ttl, s.counter)
}

// setUp writes s under key (and its fence counter).
func (s keyState) setUp(t *testing.T, c *redis.Client, key string) {
	t.Helper()
	ctx := t.Context()
	require.NoError(t, c.Del(ctx, key, script.MustFenceKey(key)).Err())
	if s.holder != "" {
		require.NoError(t, c.Set(ctx, key, s.holder, s.ttl).Err())
	}
	if s.counter != 0 {
		require.NoError(t, c.Set(ctx, script.MustFenceKey(key), s.counter, time.Hour).Err())
	}
}

// outcome is what a script left of one key: its reply for the key (a
// fence from the server's clock as "clock", a refusal as "held" with the
// holder's remaining TTL in left), the key's value and TTL, its counter
// and whether the counter expires. The TTLs shrink while the test runs:
// compare them with same, not ==.
type outcome struct {
	reply          string
	left           time.Duration
	value          string
	ttl            time.Duration
	counter        string
	counterExpires bool
}

// same asserts that o and p are the same outcome, their TTLs within a
// second of each other (the time a loaded machine may take between two
// runs of the case: the TTLs are a minute or more, or none).
func (o outcome) same(t *testing.T, p outcome, name string) {
	t.Helper()
	assert.InDelta(t, o.left, p.left, float64(time.Second), "%s: the holder's TTL in the refusal", name)
	assert.InDelta(t, o.ttl, p.ttl, float64(time.Second), "%s: the key's TTL", name)
	o.left, p.left, o.ttl, p.ttl = 0, 0, 0, 0
	assert.Equal(t, o, p, name)
}

// read reads key's outcome after a script replied v for it.
func read(t *testing.T, c *redis.Client, key string, v int64) outcome {
	t.Helper()
	ctx := t.Context()
	o := outcome{reply: fmt.Sprint(v)}
	switch left, ok := script.Remaining(v); {
	case v > 1e15: // the server's clock in µs: differs between two runs
		o.reply = "clock"
	case ok:
		o.reply, o.left = "held", left
	}
	o.value, _ = c.Get(ctx, key).Result()
	d, err := c.PTTL(ctx, key).Result()
	require.NoError(t, err)
	o.ttl = d
	fk := script.MustFenceKey(key)
	if o.counter, _ = c.Get(ctx, fk).Result(); len(o.counter) > 15 {
		o.counter = "clock"
	}
	fd, err := c.PTTL(ctx, fk).Result()
	require.NoError(t, err)
	o.counterExpires = fd > 0
	return o
}

// TestAcquireSetJudgesEachKeyAsAcquire: for every state of one key (see
// keyStates), with fencing on and off, AcquireSet of that key alone
// replies what Acquire replies, and leaves the key and its counter as
// Acquire leaves them; so a set's key is never granted, fenced or kept
// otherwise than it would be alone. Against a real redis-server.
func TestAcquireSetJudgesEachKeyAsAcquire(t *testing.T) {
	c := redistest.Start(t, redistest.Config{}).Client()
	ctx := t.Context()
	const key = "acct:1"
	ttl := 30 * time.Second
	fenceTTL := script.FenceTTL(0, ttl)
	examined := 0
	for _, fenced := range []bool{false, true} {
		for _, st := range keyStates {
			name := fmt.Sprintf("fenced %v, %v", fenced, st)
			st.setUp(t, c, key)
			mode, fk := any(script.NoFence), key
			if fenced {
				mode, fk = script.IncrFence, script.MustFenceKey(key)
			}
			v, err := script.Acquire.Run(ctx, c, script.Acquire.Args(key, fk, key, key, me, ttl.Milliseconds(), mode, script.RuleOff, script.NotDurable, fenceTTL))
			require.NoError(t, err, name)
			alone := read(t, c, key, v)

			st.setUp(t, c, key)
			var fks []string
			if fenced {
				fks = []string{script.MustFenceKey(key)}
			}
			vs, err := script.AcquireSet.RunInts(ctx, c, script.AcquireSetArgs([]string{key}, fks, me, ttl.Milliseconds(), fenceTTL))
			require.NoError(t, err, name)
			var got outcome
			if script.IsTaken(v) {
				require.Len(t, vs, 3, name)
				assert.EqualValues(t, []int64{0, 1}, vs[:2], "%s: refused at the first key", name)
				got = read(t, c, key, vs[2])
			} else {
				require.Len(t, vs, 2, name)
				assert.EqualValues(t, 1, vs[0], "%s: granted", name)
				got = read(t, c, key, vs[1])
			}
			alone.same(t, got, name)
			examined++
		}
	}
	assert.Equal(t, 2*len(keyStates), examined)
}

// TestAcquireSetWritesNothingUnlessEveryKeyIsFree: a set of three keys
// whose last is held by another: refused at that key, with its holder's
// TTL, and neither of the free keys nor their counters written; once the
// holder is gone, all three are granted, each with its own fence.
func TestAcquireSetWritesNothingUnlessEveryKeyIsFree(t *testing.T) {
	c := redistest.Start(t, redistest.Config{}).Client()
	ctx := t.Context()
	keys := []string{"a", "b", "c"}
	fks := make([]string, len(keys))
	for i, k := range keys {
		fks[i] = script.MustFenceKey(k)
	}
	require.NoError(t, c.Set(ctx, fks[0], 41, time.Hour).Err())
	require.NoError(t, c.Set(ctx, "c", "tok_X.1", time.Minute).Err())
	line := script.AcquireSetArgs(keys, fks, me, 30000, script.FenceTTL(0, 30*time.Second))

	vs, err := script.AcquireSet.RunInts(ctx, c, line)
	require.NoError(t, err)
	require.Len(t, vs, 3)
	assert.EqualValues(t, []int64{0, 3}, vs[:2], "refused at the third key")
	left, ok := script.Remaining(vs[2])
	require.True(t, ok, "the refusal carries the holder's TTL")
	assert.InDelta(t, time.Minute, left, float64(time.Second))
	n, err := c.Exists(ctx, "a", "b", fks[1], fks[2]).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "nothing written for a refused set")
	assert.Equal(t, "41", c.Get(ctx, fks[0]).Val(), "a's counter untouched")

	require.NoError(t, c.Del(ctx, "c").Err())
	vs, err = script.AcquireSet.RunInts(ctx, c, line)
	require.NoError(t, err)
	require.Len(t, vs, 4)
	assert.EqualValues(t, 1, vs[0])
	assert.EqualValues(t, 42, vs[1], "a's counter incremented")
	assert.Greater(t, vs[2], int64(1e15), "b's counter created from the server's clock")
	assert.Greater(t, vs[3], int64(1e15), "c's counter created from the server's clock")
	for _, k := range keys {
		assert.Equal(t, me, c.Get(ctx, k).Val(), "%s held under the token", k)
	}
}
