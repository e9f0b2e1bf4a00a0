package bench_test

import (
	"errors"
	"runtime"
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
// record Campaign writes, the Proclaim, the release. The Leadership also
// starts and joins its record's refresh goroutine, and lib=redlease
// registers the lock with the process-wide default watchdog, as Campaign
// does by default; lib=redlease-nokeeper campaigns WithoutKeeper, which
// the peers are like.
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
//
// The cases run one after the other, so a noisy moment of the machine
// hits one and not another: for ratios on a busy machine, see
// BenchmarkElectionPaired.
func BenchmarkElection(b *testing.B) {
	c := newClient(b, nodes(b, 1)[0])
	s, err := single.New(c)
	require.NoError(b, err)

	cases := []struct {
		name string
		op   func(b *testing.B, e *electionOps) func()
	}{
		{"lib=redlease/op=term", func(b *testing.B, e *electionOps) func() { return e.redleaseTerm(keyFor(b)) }},
		{"lib=redlease-nokeeper/op=term", func(b *testing.B, e *electionOps) func() {
			return e.redleaseTerm(keyFor(b), redlease.WithoutKeeper())
		}},
		{"lib=redsync/op=term", func(b *testing.B, e *electionOps) func() { return e.redsyncTerm(keyFor(b)) }},
		{"lib=redislock/op=term", func(b *testing.B, e *electionOps) func() { return e.redislockTerm(keyFor(b)) }},
		{"lib=redlease/op=leader", func(b *testing.B, e *electionOps) func() { return e.redleaseLeader(keyFor(b)) }},
		{"lib=raw/op=leader", func(b *testing.B, e *electionOps) func() { return e.rawLeader(keyFor(b)) }},
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			e := &electionOps{b: b, c: c, s: s}
			op := tc.op(b, e)
			per := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				op()
				per = append(per, time.Since(start))
			}
			b.StopTimer()
			reportMedian(b, per)
			if strings.HasSuffix(tc.name, "op=term") {
				b.ReportMetric(float64(e.retried)/float64(b.N), "retried/op")
			}
		})
	}
}

// BenchmarkElectionPaired times BenchmarkElection's ops in pairs, op by op
// and alternating which goes first (pairedLoop), so that a noisy moment of
// the machine hits both sides of a ratio alike: a term of redlease (with
// the default keeper, and without) against a term of redsync and of
// bsm/redislock, and Election.Leader against the GET of the peers'
// record. The name says how many CPUs the process may use (see
// BenchmarkIdempotencyPaired); the metrics are reportPaired's, with "ours"
// the first of the case's name and "raw" the second; ns/op and allocs/op
// are the pair's; server-us/op is the time the server spent executing the
// pair's commands (INFO commandstats); retried/op counts the pair's
// refused attempts, retried at once.
func BenchmarkElectionPaired(b *testing.B) {
	addr := nodes(b, 1)[0]
	c := newClient(b, addr)
	s, err := single.New(c)
	require.NoError(b, err)
	type mk func(e *electionOps, key string) func()
	var (
		term       mk = func(e *electionOps, k string) func() { return e.redleaseTerm(k) }
		termNoKeep mk = func(e *electionOps, k string) func() { return e.redleaseTerm(k, redlease.WithoutKeeper()) }
		redsyncT   mk = (*electionOps).redsyncTerm
		redislockT mk = (*electionOps).redislockTerm
	)
	cases := []struct {
		name        string
		ours, floor mk
	}{
		{"redlease/redsync", term, redsyncT},
		{"redlease/redislock", term, redislockT},
		{"redlease-nokeeper/redsync", termNoKeep, redsyncT},
		{"redlease-nokeeper/redislock", termNoKeep, redislockT},
		{"redlease-leader/raw-get", (*electionOps).redleaseLeader, (*electionOps).rawLeader},
	}
	cpus := "cpus=" + strconv.Itoa(runtime.NumCPU())
	for _, tc := range cases {
		b.Run(cpus+"/case="+tc.name, func(b *testing.B) {
			e := &electionOps{b: b, c: c, s: s}
			ours, floor := tc.ours(e, keyFor(b, "ours")), tc.floor(e, keyFor(b, "floor"))
			ours() // the scripts loaded, the connection dialled
			floor()
			e.retried = 0
			before := serverUsec(b, addr)
			b.ReportAllocs()
			pairedLoop(b, func(int) { ours() }, func(int) { floor() })
			reportServerTime(b, addr, before)
			b.ReportMetric(float64(e.retried)/float64(b.N), "retried/op")
		})
	}
}

// electionOps builds the ops of the election benchmarks on one client and
// its single strategy, each on its own key; retried counts the attempts a
// term's lock was refused and tried again at once (up to maxRetries).
type electionOps struct {
	b       *testing.B
	c       *redis.Client
	s       redlease.Strategy
	retried int
}

// redleaseTerm: Campaign (one attempt, tried again at once if refused),
// Proclaim, Resign.
func (e *electionOps) redleaseTerm(key string, opts ...redlease.LockOption) func() {
	locker, err := redlease.New(e.s, redlease.WithTTL(singleTTL))
	require.NoError(e.b, err)
	el, err := redlease.NewElection(locker, key)
	require.NoError(e.b, err)
	opts = append(opts, redlease.WithMaxAttempts(1))
	return func() {
		ld, err := el.Campaign(background, "replica-1", opts...)
		for n := 0; err != nil && notObtained(err) && n < maxRetries; n++ {
			e.retried++
			ld, err = el.Campaign(background, "replica-1", opts...)
		}
		if err != nil {
			e.b.Fatal(err)
		}
		if err := ld.Proclaim(background, "replica-1 (batch 2)"); err != nil {
			e.b.Fatal(err)
		}
		if err := ld.Resign(background); err != nil {
			e.b.Fatal(err)
		}
	}
}

// errRetry is what a peer's lock returns for a refused attempt.
var errRetry = errors.New("not obtained")

// redsyncTerm: peerTerm with a redsync Mutex on one pool.
func (e *electionOps) redsyncTerm(key string) func() {
	m := redsync.New(pools([]*redis.Client{e.c})...).NewMutex(key,
		redsync.WithExpiry(singleTTL), redsync.WithTries(1))
	return e.peerTerm(key, func() error {
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
}

// redislockTerm: peerTerm with bsm/redislock.
func (e *electionOps) redislockTerm(key string) func() {
	rl := redislock.New(e.c)
	var lk *redislock.Lock
	return e.peerTerm(key, func() error {
		var err error
		lk, err = rl.Obtain(background, key, singleTTL, nil)
		if errors.Is(err, redislock.ErrNotObtained) {
			return errRetry
		}
		return err
	}, func() error { return lk.Release(background) })
}

// peerTerm: lock (tried again at once while it returns errRetry), INCR of
// the term, SET of the record, SET of it again, unlock.
func (e *electionOps) peerTerm(key string, lock, unlock func() error) func() {
	termKey, record := key+":term", key+":leader"
	return func() {
		err := lock()
		for n := 0; errors.Is(err, errRetry) && n < maxRetries; n++ {
			e.retried++
			err = lock()
		}
		if err != nil {
			e.b.Fatal(err)
		}
		term, err := e.c.Incr(background, termKey).Result()
		if err != nil {
			e.b.Fatal(err)
		}
		t := strconv.FormatInt(term, 10)
		if err := e.c.Set(background, record, t+":replica-1", singleTTL).Err(); err != nil {
			e.b.Fatal(err)
		}
		if err := e.c.Set(background, record, t+":replica-1 (batch 2)", singleTTL).Err(); err != nil {
			e.b.Fatal(err)
		}
		if err := unlock(); err != nil {
			e.b.Fatal(err)
		}
	}
}

// redleaseLeader: Election.Leader, with a term held (campaigned here,
// resigned when the benchmark ends).
func (e *electionOps) redleaseLeader(key string) func() {
	locker, err := redlease.New(e.s, redlease.WithTTL(singleTTL))
	require.NoError(e.b, err)
	el, err := redlease.NewElection(locker, key)
	require.NoError(e.b, err)
	ld, err := el.Campaign(background, "replica-1")
	require.NoError(e.b, err)
	e.b.Cleanup(func() { _ = ld.Resign(background) })
	want := redlease.Leader{Term: ld.Term(), Value: "replica-1"}
	return func() {
		got, err := el.Leader(background)
		if err != nil || got != want {
			e.b.Fatal(got, err)
		}
	}
}

// rawLeader: a GET of a peer's record "term:value" and the parse of its
// term, with the record written here once.
func (e *electionOps) rawLeader(key string) func() {
	record := key + ":leader"
	require.NoError(e.b, e.c.Set(background, record, "7:replica-1", singleTTL).Err())
	return func() {
		v, err := e.c.Get(background, record).Result()
		if err != nil {
			e.b.Fatal(err)
		}
		t, value, _ := strings.Cut(v, ":")
		if term, err := strconv.ParseUint(t, 10, 64); err != nil || term != 7 || value != "replica-1" {
			e.b.Fatal(v, err)
		}
	}
}
