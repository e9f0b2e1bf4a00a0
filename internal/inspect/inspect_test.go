package inspect

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease"
)

func held(tok string, ttl time.Duration, fence uint64) redlease.NodeView {
	return redlease.NodeView{Held: true, Token: tok, TTL: ttl, Fence: fence}
}

var (
	free    = redlease.NodeView{}
	down    = redlease.NodeView{Err: errors.New("connection refused")}
	noperm  = redlease.NodeView{Err: redisErr("NOPERM this user has no permissions to run the 'evalsha' command")}
	second  = time.Second
	noTTL   = time.Duration(-1)
	unknown = time.Time{}
)

type redisErr string

func (e redisErr) Error() string { return string(e) }
func (redisErr) RedisError()     {}

var _ redis.Error = redisErr("")

func TestJudge(t *testing.T) {
	cases := []struct {
		name      string
		views     []redlease.NodeView
		quorum    int
		state     redlease.KeyState
		token     string
		holding   int
		remaining time.Duration
		fence     uint64
		err       error
	}{
		{"single free", []redlease.NodeView{free}, 1, redlease.KeyFree, "", 0, 0, 0, nil},
		{"single held", []redlease.NodeView{held("a", second, 7)}, 1, redlease.KeyHeld, "a", 1, second, 7, nil},
		{"single down: never held", []redlease.NodeView{down}, 1, redlease.KeyUnavailable, "", 0, 0, 0, redlease.ErrUnavailable},
		{"single denied", []redlease.NodeView{noperm}, 1, redlease.KeyUnavailable, "", 0, 0, 0, redlease.ErrDenied},
		{"held on a majority: the longest TTL, the highest fence",
			[]redlease.NodeView{held("a", second, 7), held("a", 2*second, 9), free}, 2, redlease.KeyHeld, "a", 2, 2 * second, 9, nil},
		{"a key without expiry", []redlease.NodeView{held("a", second, 0), held("a", noTTL, 0), down}, 2, redlease.KeyHeld, "a", 2, noTTL, 0, nil},
		{"free on a majority", []redlease.NodeView{held("a", second, 7), free, free}, 2, redlease.KeyFree, "a", 1, second, 7, nil},
		{"split: the most held, ties to the smallest",
			[]redlease.NodeView{held("b", second, 3), held("a", second, 2), free}, 2, redlease.KeySplit, "a", 1, second, 2, nil},
		{"a majority down is unavailable, even where the others hold",
			[]redlease.NodeView{held("a", second, 7), down, down}, 2, redlease.KeyUnavailable, "a", 1, second, 7, redlease.ErrUnavailable},
		{"one down: the others decide", []redlease.NodeView{held("a", second, 7), held("a", second, 7), down}, 2, redlease.KeyHeld, "a", 2, second, 7, nil},
		{"denials alone rule the majority out",
			[]redlease.NodeView{noperm, noperm, free}, 2, redlease.KeyUnavailable, "", 0, 0, 0, redlease.ErrDenied},
		{"one denial among failures is an outage",
			[]redlease.NodeView{noperm, down, free}, 2, redlease.KeyUnavailable, "", 0, 0, 0, redlease.ErrUnavailable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			in, err := Judge(context.Background(), "k", c.views, c.quorum)
			assert.Equal(t, c.state, in.State, "state")
			assert.Equal(t, c.token, in.Token, "token")
			assert.Equal(t, c.holding, in.Holding, "holding")
			assert.Equal(t, c.remaining, in.Remaining, "remaining")
			assert.Equal(t, c.fence, in.Fence, "fence")
			if c.err == nil {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, c.err)
				assert.NotErrorIs(t, err, redlease.ErrNotObtained)
				var ne *redlease.NodeError
				assert.ErrorAs(t, err, &ne, "the per-node causes")
			}
			if c.err != redlease.ErrUnavailable {
				assert.NotErrorIs(t, err, redlease.ErrUnavailable, "an outage only where it is one")
			}
		})
	}
}

func TestJudgeHolderRecord(t *testing.T) {
	since := time.Date(2026, 12, 4, 5, 0, 0, 123000, time.UTC)
	rec := &redlease.HolderRecord{Token: "a", Host: "h", PID: 9, Since: since}
	withRec := held("a", second, 1)
	withRec.Holder = rec
	in, err := Judge(context.Background(), "k", []redlease.NodeView{held("a", second, 1), withRec, free}, 2)
	require.NoError(t, err)
	assert.Same(t, rec, in.Holder, "from any node that has it")
	assert.Equal(t, since, in.Since)

	in, err = Judge(context.Background(), "k", []redlease.NodeView{held("a", second, 1), held("a", second, 1)}, 2)
	require.NoError(t, err)
	assert.Nil(t, in.Holder)
	assert.Equal(t, unknown, in.Since, "no record: unknown")
}

func TestParse(t *testing.T) {
	nv, err := parse([]any{int64(1), "tok", int64(1500), "42", int64(3), "tok", "h", "7", "2026-12-04T05:00:00.5Z", "cmd", "41"})
	require.NoError(t, err)
	assert.Equal(t, redlease.NodeView{Held: true, Token: "tok", TTL: 1500 * time.Millisecond, Fence: 42, Waiters: 3,
		Holder: &redlease.HolderRecord{Token: "tok", Host: "h", PID: 7, Since: time.Date(2026, 12, 4, 5, 0, 0, 5e8, time.UTC), Command: "cmd", Fence: 41}}, nv)

	nv, err = parse([]any{int64(1), "tok", int64(-1), "", int64(0), "other", "h", "7", "x", "cmd", "41"})
	require.NoError(t, err)
	assert.Equal(t, redlease.NodeView{Held: true, Token: "tok", TTL: -1}, nv, "no expiry; another token's record is not the holder's")

	nv, err = parse([]any{int64(0), "", int64(0), "99", int64(0), "", "", "", "", "", ""})
	require.NoError(t, err)
	assert.Equal(t, redlease.NodeView{Fence: 99}, nv)

	_, err = parse([]any{int64(0)})
	assert.Error(t, err)
}

func TestForced(t *testing.T) {
	addrs := []string{"a", "b", "c"}
	refused := errors.New("connection refused")
	cases := []struct {
		name    string
		deleted []bool
		errs    []error
		n       int
		err     error
	}{
		{"deleted on a majority", []bool{true, true, false}, []error{nil, nil, nil}, 2, nil},
		{"deleted where it was, the rest never had it", []bool{true, false, false}, []error{nil, nil, nil}, 1, nil},
		{"changed hands: nothing deleted", []bool{false, false, false}, []error{nil, nil, refused}, 0, redlease.ErrNotHeld},
		{"too few answered to say", []bool{true, false, false}, []error{nil, refused, refused}, 1, redlease.ErrUnavailable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r, err := Forced(context.Background(), "k", "tok", addrs, c.deleted, c.errs, 2)
			assert.Equal(t, c.n, r.Deleted)
			require.Len(t, r.Nodes, 3)
			for i, n := range r.Nodes {
				assert.Equal(t, i, n.Node)
				assert.Equal(t, addrs[i], n.Addr)
				assert.Equal(t, c.errs[i], n.Err)
			}
			if c.err == nil {
				assert.NoError(t, err)
			} else {
				assert.ErrorIs(t, err, c.err)
			}
		})
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A key no lock can have is refused before anything is sent (the command
// line would need its fence key): ErrInvalid, never a panic.
func TestReadRefusesBadKeys(t *testing.T) {
	for _, key := range []string{"", "a}b", redlease.ReservedPrefix + "x"} {
		_, err := Read(context.Background(), nil, key)
		assert.ErrorIs(t, err, redlease.ErrInvalid, "%q", key)
	}
}
