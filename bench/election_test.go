package bench_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/single"
)

// BenchmarkElection: leader election on one node (the single strategy,
// fences on, which an election needs), sequentially, through one client.
//
// op=term is one uncontended term per op. redlease: Campaign (granted at
// once: WithMaxAttempts(1), a refusal is retried at once and counted as
// retried/op), one Proclaim of a new value, Resign. On the wire that is
// four scripts: the acquire (with the fence's INCR, the term), the
// record Campaign writes, the Proclaim, the release. The
// Leadership also starts and joins its record's refresh goroutine, and
// lib=redlease registers the lock with the process-wide default watchdog,
// as Campaign does by default; lib=redlease-nokeeper campaigns
// WithoutKeeper, which the peers are like.
//
// The peers are what a redsync or bsm/redislock user would write for the
// same term on the same server: the library's lock (redsync: a Mutex on one
// pool, WithTries(1); redislock: Obtain), INCR of a term counter (the user
// needs a term, and neither lock has a fence), a SET PX of the leader record
// "term:value" (what Campaign records), a second SET (what Proclaim
// records), then the library's unlock: five round trips. They do less: the
// record writes are not checked against the lock's token, so a deposed
// leader whose lock expired can still overwrite its successor's record;
// the term is not taken with the grant, so a holder paused between its
// lock and its INCR can come back with a term above its successor's;
// nothing is published to observers; nothing keeps the lock or the record
// alive.
//
// op=leader is one read of the current leader per op, with a term held:
// redlease's Election.Leader (one script reading the key's holder and the
// record together, so that a deposed leader's record is never reported)
// beside lib=raw, a GET of the peers' record and the split of its term,
// which reports whatever record is there, a deposed leader's included.
// Neither side has anything like Observe in the op.
func BenchmarkElection(b *testing.B) {
	c := newClient(b, nodes(b, 1)[0])
	s, err := single.New(c)
	require.NoError(b, err)

	b.Run("lib=redlease/op=term", func(b *testing.B) { redleaseTerm(b, s) })
	b.Run("lib=redlease-nokeeper/op=term", func(b *testing.B) { redleaseTerm(b, s, redlease.WithoutKeeper()) })
	b.Run("lib=redsync/op=term", func(b *testing.B) {
		m := redsync.New(pools([]*redis.Client{c})...).NewMutex(keyFor(b),
			redsync.WithExpiry(singleTTL), redsync.WithTries(1))
		peerTerm(b, c, func() error {
			err := m.LockContext(background)
			if err != nil && redsyncNotObtained(err) {
				return errRetry
			}
			return err
		}, func() error {
			if ok, err := m.UnlockContext(background); !ok {
				return errors.Join(errors.New("redsync: not unlocked"), err)
			}
			return nil
		})
	})
	b.Run("lib=redislock/op=term", func(b *testing.B) {
		rl := redislock.New(c)
		key := keyFor(b)
		var lk *redislock.Lock
		peerTerm(b, c, func() error {
			var err error
			lk, err = rl.Obtain(background, key, singleTTL, nil)
			if errors.Is(err, redislock.ErrNotObtained) {
				return errRetry
			}
			return err
		}, func() error { return lk.Release(background) })
	})

	b.Run("lib=redlease/op=leader", func(b *testing.B) {
		locker, err := redlease.New(s, redlease.WithTTL(singleTTL))
		require.NoError(b, err)
		el, err := redlease.NewElection(locker, keyFor(b))
		require.NoError(b, err)
		ld, err := el.Campaign(background, "replica-1")
		require.NoError(b, err)
		b.Cleanup(func() { _ = ld.Resign(background) })
		want := redlease.Leader{Term: ld.Term(), Value: "replica-1"}
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			got, err := el.Leader(background)
			if err != nil || got != want {
				b.Fatal(got, err)
			}
		}
	})
	b.Run("lib=raw/op=leader", func(b *testing.B) {
		record := keyFor(b, "leader")
		require.NoError(b, c.Set(background, record, "7:replica-1", singleTTL).Err())
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			v, err := c.Get(background, record).Result()
			if err != nil {
				b.Fatal(err)
			}
			t, value, _ := strings.Cut(v, ":")
			if term, err := strconv.ParseUint(t, 10, 64); err != nil || term != 7 || value != "replica-1" {
				b.Fatal(v, err)
			}
		}
	})
}

// errRetry is what a peer's lock returns for a refused attempt.
var errRetry = errors.New("not obtained")

// redleaseTerm: Campaign, Proclaim, Resign, b.N times, on one key.
func redleaseTerm(b *testing.B, s redlease.Strategy, opts ...redlease.LockOption) {
	locker, err := redlease.New(s, redlease.WithTTL(singleTTL))
	require.NoError(b, err)
	el, err := redlease.NewElection(locker, keyFor(b))
	require.NoError(b, err)
	opts = append(opts, redlease.WithMaxAttempts(1))
	per := make([]time.Duration, 0, b.N)
	retried := 0
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		ld, err := el.Campaign(background, "replica-1", opts...)
		for n := 0; err != nil && notObtained(err) && n < maxRetries; n++ {
			retried++
			ld, err = el.Campaign(background, "replica-1", opts...)
		}
		if err != nil {
			b.Fatal(err)
		}
		if err := ld.Proclaim(background, "replica-1 (batch 2)"); err != nil {
			b.Fatal(err)
		}
		if err := ld.Resign(background); err != nil {
			b.Fatal(err)
		}
		per = append(per, time.Since(start))
	}
	b.StopTimer()
	reportMedian(b, per)
	b.ReportMetric(float64(retried)/float64(b.N), "retried/op")
}

// peerTerm: lock, INCR of the term, SET of the record, SET of it again,
// unlock, b.N times. lock returns errRetry for a refused attempt.
func peerTerm(b *testing.B, c *redis.Client, lock, unlock func() error) {
	termKey, record := keyFor(b, "term"), keyFor(b, "leader")
	per := make([]time.Duration, 0, b.N)
	retried := 0
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		err := lock()
		for n := 0; errors.Is(err, errRetry) && n < maxRetries; n++ {
			retried++
			err = lock()
		}
		if err != nil {
			b.Fatal(err)
		}
		term, err := c.Incr(background, termKey).Result()
		if err != nil {
			b.Fatal(err)
		}
		t := strconv.FormatInt(term, 10)
		if err := c.Set(background, record, t+":replica-1", singleTTL).Err(); err != nil {
			b.Fatal(err)
		}
		if err := c.Set(background, record, t+":replica-1 (batch 2)", singleTTL).Err(); err != nil {
			b.Fatal(err)
		}
		if err := unlock(); err != nil {
			b.Fatal(err)
		}
		per = append(per, time.Since(start))
	}
	b.StopTimer()
	reportMedian(b, per)
	b.ReportMetric(float64(retried)/float64(b.N), "retried/op")
}
