package bench_test

import (
	"crypto/rand"
	"encoding/base64"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/single"
)

// singleTTL is the lock TTL of every one-node benchmark.
const singleTTL = 10 * time.Second

// rawRelease is the floor's compare-and-delete; go-redis's Script.Run sends
// it as EVALSHA (EVAL once, on NOSCRIPT).
var rawRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkSingle: one acquire and one release of one key per op on one
// node, through one client: redlease's single strategy (fences on, its
// default, and off), bsm/redislock, and the raw floor — SET NX PX with a
// fresh random token, then an EVALSHA compare-and-delete, which is what
// any correct one-node lock must send. Sequential ops reuse one pooled
// connection.
func BenchmarkSingle(b *testing.B) {
	c := newClient(b, nodes(b, 1)[0])

	redleaseOne := func(s redlease.Strategy) func(b *testing.B) {
		return func(b *testing.B) {
			locker, err := redlease.New(s, redlease.WithTTL(singleTTL))
			require.NoError(b, err)
			key := keyFor(b)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				lk, err := locker.TryLock(background, key)
				if err != nil {
					b.Fatal(err)
				}
				if err := lk.Release(background); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	strategy, err := single.New(c)
	require.NoError(b, err)
	b.Run("lib=redlease", redleaseOne(strategy))
	strategy2, err := single.New(c, single.WithoutFencing())
	require.NoError(b, err)
	b.Run("lib=redlease-nofence", redleaseOne(strategy2))

	b.Run("lib=redislock", func(b *testing.B) {
		rl := redislock.New(c)
		key := keyFor(b)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			lk, err := rl.Obtain(background, key, singleTTL, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(background); err != nil {
				b.Fatal(err)
			}
		}
	})

	b.Run("lib=raw", func(b *testing.B) {
		key := keyFor(b)
		var tok [16]byte
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			_, _ = rand.Read(tok[:])
			token := base64.RawURLEncoding.EncodeToString(tok[:])
			ok, err := c.SetNX(background, key, token, singleTTL).Result()
			if err != nil || !ok {
				b.Fatal(ok, err)
			}
			n, err := rawRelease.Run(background, c, []string{key}, token).Int64()
			if err != nil || n != 1 {
				b.Fatal(n, err)
			}
		}
	})
}

// fencedAcquire is the least a fenced one-node lock must send to acquire:
// SET NX PX and, on a grant, INCR of the key's fence counter and PEXPIRE
// of it (nothing is left in Redis without a TTL), in one EVALSHA so that no
// grant goes without its fence. It has none of redlease's other work (a
// resent attempt's own key, a counter created anew starting from the
// server's clock, fair mode's line).
var fencedAcquire = redis.NewScript(`if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local f = redis.call('INCR', KEYS[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  return f
end
return -1`)

// BenchmarkSinglePaired times, op by op and alternating which goes first
// (pairedLoop), one acquire+release of redlease's single strategy against
// the raw floor of BenchmarkSingle, and the same for the other one-node
// locks: redlease without fences, bsm/redislock, and the fenced floor
// (fencedAcquire, then the floor's compare-and-delete; redlease's release
// also publishes the release notice). So a noisy moment of
// the machine hits both sides of a ratio alike. The name says how many CPUs
// the process may use (see BenchmarkIdempotencyPaired); the metrics are
// reportPaired's, with "ours" the first library of the case's name and
// "raw" the second; ns/op and allocs/op are the pair's; server-us/op: the time the server spent executing
// the pair's commands (INFO commandstats), which no client or scheduler
// noise moves.
func BenchmarkSinglePaired(b *testing.B) {
	addr := nodes(b, 1)[0]
	c := newClient(b, addr)
	fenced, err := single.New(c)
	require.NoError(b, err)
	unfenced, err := single.New(c, single.WithoutFencing())
	require.NoError(b, err)
	lockerOf := func(s redlease.Strategy) *redlease.Locker {
		l, err := redlease.New(s, redlease.WithTTL(singleTTL))
		require.NoError(b, err)
		return l
	}
	redleaseOp := func(l *redlease.Locker, key string) func(int) {
		return func(int) {
			lk, err := l.TryLock(background, key)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(background); err != nil {
				b.Fatal(err)
			}
		}
	}
	var tok [16]byte
	token := func() string {
		_, _ = rand.Read(tok[:])
		return base64.RawURLEncoding.EncodeToString(tok[:])
	}
	rawOp := func(key string) func(int) {
		return func(int) {
			t := token()
			ok, err := c.SetNX(background, key, t, singleTTL).Result()
			if err != nil || !ok {
				b.Fatal(ok, err)
			}
			if n, err := rawRelease.Run(background, c, []string{key}, t).Int64(); err != nil || n != 1 {
				b.Fatal(n, err)
			}
		}
	}
	ttl := strconv.FormatInt(singleTTL.Milliseconds(), 10)
	fenceTTL := strconv.FormatInt(redlease.DefaultFenceTTL.Milliseconds(), 10)
	fencedOp := func(key string) func(int) {
		keys := []string{key, "fence-floor:" + key}
		return func(int) {
			t := token()
			if f, err := fencedAcquire.Run(background, c, keys, t, ttl, fenceTTL).Int64(); err != nil || f < 1 {
				b.Fatal(f, err)
			}
			if n, err := rawRelease.Run(background, c, keys[:1], t).Int64(); err != nil || n != 1 {
				b.Fatal(n, err)
			}
		}
	}
	redislockOp := func(key string) func(int) {
		rl := redislock.New(c)
		return func(int) {
			lk, err := rl.Obtain(background, key, singleTTL, nil)
			if err != nil {
				b.Fatal(err)
			}
			if err := lk.Release(background); err != nil {
				b.Fatal(err)
			}
		}
	}
	cases := []struct {
		name        string
		ours, floor func(key string) func(int)
	}{
		{"redlease/raw", func(k string) func(int) { return redleaseOp(lockerOf(fenced), k) }, rawOp},
		{"redlease/raw-fenced", func(k string) func(int) { return redleaseOp(lockerOf(fenced), k) }, fencedOp},
		{"raw-fenced/raw", fencedOp, rawOp},
		{"redlease-nofence/raw", func(k string) func(int) { return redleaseOp(lockerOf(unfenced), k) }, rawOp},
		{"redlease/redislock", func(k string) func(int) { return redleaseOp(lockerOf(fenced), k) }, redislockOp},
		{"redlease-nofence/redislock", func(k string) func(int) { return redleaseOp(lockerOf(unfenced), k) }, redislockOp},
		{"raw-fenced/redislock", fencedOp, redislockOp},
	}
	cpus := "cpus=" + strconv.Itoa(runtime.NumCPU())
	for _, tc := range cases {
		b.Run(cpus+"/case="+tc.name, func(b *testing.B) {
			ours, floor := tc.ours(keyFor(b, "ours")), tc.floor(keyFor(b, "floor"))
			ours(0) // the scripts loaded, the connection dialled
			floor(0)
			before := serverUsec(b, addr)
			b.ReportAllocs()
			pairedLoop(b, ours, floor)
			reportServerTime(b, addr, before)
		})
	}
}
