// Command settlement moves money exactly once, however often a settlement
// arrives: many clients send every settlement two or three times (some
// copies at the same moment), give up waiting and resend, and one holder
// freezes past its lease and wakes up to write with an old fence. At the
// end it gives two verdicts, kept apart:
//
//   - safety: no settlement took effect twice, none that a client was told is
//     done is missing from the ledger, every balance equals the sum of its
//     settlements, and the frozen holder's stale write was refused by its
//     fence;
//   - liveness: every request got an answer. Under load lock attempts miss
//     their node timeouts and clients time out; like real clients they
//     resend the same request after a backoff, and the demo counts those
//     retries. A request still without an answer after retryLimit attempts
//     or retryFor is a liveness failure.
//
// With both verdicts good it ends with "exactly-once verified" (at most once
// is safety, at least once is liveness). Otherwise it says which verdict
// failed and why (SAFETY or LIVENESS) and exits 1. Before the verdicts it
// says why requests needed retries: the scenario's own (copies sent at
// once, the slow downstream), and any others (attempts slower than a
// client waits, with the server-side times and the machine's load).
//
// On a terminal the progress is one line redrawn in place; into a pipe or
// a CI log it is a plain line every five seconds.
//
// The pieces:
//
//   - an idempotency.Barrier keyed on the settlement id, its in-flight locks
//     on a five-node quorum (quorum.WithFencing) renewed by a renew.Watchdog,
//     its records on a separate store;
//   - inside the handler, a second quorum lock on the account, whose fence
//     guards the account row;
//   - an SQLite ledger that applies a settlement only with a fence above the
//     account's last one:
//     UPDATE account SET balance = balance + ?, fence = ? WHERE id = ? AND fence < ?
//
// By default everything runs in-process (six miniredis servers and an
// SQLite file in a temp dir), so it needs no servers:
//
//	go -C examples run ./settlement
//
// Point it at real Redis with -nodes (independent primaries for the lock
// quorum) and -store (the Redis that keeps the idempotency records):
//
//	go -C examples run ./settlement -nodes 127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005 -store 127.0.0.1:7000
//
// Every run uses its own key prefix; on real servers the records expire
// after ten minutes, the per-account fence counters stay (they have no TTL,
// by design).
package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/renew"
)

// Timings of the scenario. A client waits clientTimeout (-client-timeout)
// for an answer, then gives up and resends; a few handlers call a slow
// downstream that takes half as long again (slowDownstream), so their
// clients resend while the first run goes on: those timeouts are by design.
// The frozen holder's locks live stallLease and are not renewed.
//
// A client timeout is a second, as an HTTP client's would be, not a tenth:
// in-process, the six servers (miniredis runs every lock script in a Lua
// interpreter written in Go), the sixteen clients and SQLite share the
// machine's CPUs, so a settlement takes tens of milliseconds when a real
// redis-server answers in a fraction of one. With 100 ms, half the sends
// timed out on 2 cores, and every timed-out attempt kept running on the
// server beside its resend, which made the next ones slower still.
const (
	accounts      = 20
	serverTimeout = 8 * time.Second
	lease         = 2 * time.Second
	stallLease    = 300 * time.Millisecond
)

// clientTimeout is how long a client waits for an answer (-client-timeout).
var clientTimeout = time.Second

// slowDownstream is how long the slow downstream takes: longer than a
// client waits, so that its clients time out and resend.
func slowDownstream() time.Duration { return clientTimeout * 3 / 2 }

// A client's retries. After a timeout, or an answer that means "not now"
// (see retryable), a client resends the same request after a backoff that
// grows from retryMin to retryMax, at most retryLimit times and for at most
// retryFor in all. These bounds are generous on purpose: on a loaded 2-core
// machine a request may need a dozen attempts, but one that needs more than
// this is stuck, not slow.
const (
	retryMin   = 20 * time.Millisecond
	retryMax   = 500 * time.Millisecond
	retryLimit = 100
	retryFor   = 30 * time.Second
)

func main() {
	nodesFlag := flag.String("nodes", "", "comma-separated addresses of independent Redis primaries for the lock quorum (default: 5 in-process nodes)")
	storeFlag := flag.String("store", "", "address of the Redis that keeps idempotency records (default: in-process)")
	settlements := flag.Int("settlements", 400, "distinct settlements")
	clients := flag.Int("clients", 16, "concurrent clients")
	flag.DurationVar(&clientTimeout, "client-timeout", clientTimeout, "how long a client waits for an answer before it resends")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *nodesFlag, *storeFlag, *settlements, *clients); err != nil {
		fmt.Fprintln(os.Stderr, "\nsettlement: FAILED:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, nodeList, storeAddr string, n, clients int) error {
	if n < 1 || clients < 1 || clientTimeout <= 0 {
		return fmt.Errorf("-settlements, -clients and -client-timeout must be positive")
	}
	env, err := connect(nodeList, storeAddr)
	if err != nil {
		return err
	}
	defer env.close()

	q, err := quorum.New(env.nodes, quorum.WithFencing(), quorum.WithNodeTimeout(200*time.Millisecond))
	if err != nil {
		return err
	}
	defer q.Close()
	watchdog, err := renew.New()
	if err != nil {
		return err
	}
	defer watchdog.Close()

	// One prefix per run, so that a second run against real servers does
	// not replay the first run's results.
	prefix := "redlease-settlement:" + randomHex(4) + ":"
	barrier, err := idempotency.New(env.store,
		idempotency.WithStrategy(q), idempotency.WithKeeper(watchdog),
		idempotency.WithLease(lease), idempotency.WithRetention(10*time.Minute),
		idempotency.WithPrefix(prefix+"idem:"))
	if err != nil {
		return err
	}

	// Why a second lock, on the account: fences rise per lock key. The
	// barrier's lock is per settlement id, so nearly every settlement runs
	// under that key's first fence (1): those fences say nothing about the
	// order of writers of one account row, and checking them against the
	// row would reject every settlement after the first on each account.
	// The row needs a fence from the one sequence that every writer of that
	// row draws from: a lock on the account. The barrier makes each
	// settlement run once; the account lock makes writers of one balance
	// take turns, and its fence lets the ledger refuse a writer whose turn
	// is over.
	accountLocks, err := redlease.New(q, redlease.WithKeeper(watchdog), redlease.WithTTL(lease),
		redlease.WithRetryDelay(2*time.Millisecond, 40*time.Millisecond), redlease.WithPrefix(prefix+"account:"))
	if err != nil {
		return err
	}

	dir, err := os.MkdirTemp("", "redlease-settlement-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ledger, err := openLedger(filepath.Join(dir, "ledger.db"))
	if err != nil {
		return err
	}
	defer ledger.db.Close()

	work := generate(n)
	sends := schedule(work)
	svc := &service{
		barrier:  barrier,
		accounts: accountLocks,
		ledger:   ledger,
		stallID:  work[0].ID,
	}
	// The frozen holder: same records, same lock keys, but nothing renews
	// its locks and they live only stallLease. A GC pause or a frozen VM
	// looks like this to everyone else.
	svc.frozenBarrier, err = idempotency.New(env.store, idempotency.WithStrategy(q),
		idempotency.WithLease(stallLease), idempotency.WithRetention(10*time.Minute), idempotency.WithPrefix(prefix+"idem:"))
	if err != nil {
		return err
	}
	// The frozen holder stands for a process paused past its lease: nothing
	// renews its lock (Do would, by default), so it expires under it.
	svc.frozenAccounts, err = redlease.New(q, redlease.WithTTL(stallLease), redlease.WithPrefix(prefix+"account:"), redlease.WithoutKeeper())
	if err != nil {
		return err
	}

	fmt.Printf("%d settlements on %d accounts, sent %d times in all by %d clients (timeout %v, then resend)\n",
		n, accounts, len(sends), clients, clientTimeout)
	fmt.Printf("locks: quorum on %s (majority %d), fenced, renewed by a watchdog\n", env.where, q.Quorum())
	fmt.Printf("records: %s   ledger: %s\n\n", env.storeWhere, filepath.Join(dir, "ledger.db"))

	// The clients.
	var (
		st         stats
		pending    sync.WaitGroup // requests still running on the server, answered or not
		clientWG   sync.WaitGroup
		gaveUp     errorList // requests whose client ran out of retries: liveness
		unexpected errorList // errors that are neither "not now" nor a result
	)
	svc.stats, svc.console = &st, &console{tty: stdoutIsTerminal()}
	queue := make(chan settlement)
	start := time.Now()
	stopProgress := svc.console.progress(func() string { return st.line(ledger, n) })
	for range clients {
		clientWG.Go(func() {
			for s := range queue {
				if err := svc.send(ctx, s, &pending, &unexpected); err != nil && ctx.Err() == nil {
					svc.console.event("LIVENESS: %v", err)
					gaveUp.add(err)
				}
			}
		})
	}
	for _, s := range sends {
		select {
		case queue <- s:
		case <-ctx.Done():
		}
	}
	close(queue)
	clientWG.Wait()
	pending.Wait() // requests whose clients gave up still finish on the server
	stopProgress()
	elapsed := time.Since(start)

	fmt.Printf("\n%-40s %6d\n", "requests sent", st.sent.Load())
	fmt.Printf("%-40s %6d of %d\n", "settlements applied", ledger.applied.Load(), n)
	fmt.Printf("%-40s %6d\n", "duplicates replayed", st.replayed.Load())
	fmt.Printf("%-40s %6d\n", "in-progress conflicts", st.inProgress.Load())
	fmt.Printf("%-40s %6d\n", "client timeouts, resent", st.timeouts.Load())
	fmt.Printf("%-40s %6d\n", "requests that needed retries", st.retried.Load())
	fmt.Printf("%-40s %6d\n", "lock attempts not obtained in time", st.lockMisses.Load())
	fmt.Printf("%-40s %6d\n", "locks lost under a running handler", st.lost.Load())
	fmt.Printf("%-40s %6d\n", "stale writes rejected by fence", ledger.stale.Load())
	fmt.Printf("%-40s %6d\n", "duplicates stopped only by the ledger key", ledger.already.Load())
	fmt.Printf("%-40s %6.1fs\n\n", "time", elapsed.Seconds())
	p50, p99, most, over := st.latency()
	fmt.Printf("server time per attempt (no slow downstream): median %v, p99 %v, max %v; %d over the client's %v\n",
		p50.Round(time.Millisecond), p99.Round(time.Millisecond), most.Round(time.Millisecond), over, clientTimeout)
	if st.retried.Load() > 0 {
		// Say why requests needed retries: answers "in progress" and the
		// slow downstream's timeouts are the scenario; other timeouts and
		// lock attempts not obtained in time mean the server was slower
		// than a client waits.
		why := fmt.Sprintf("why the retries: %d \"in progress\" answers (copies of one settlement sent at once: by design), "+
			"%d client timeouts of the slow downstream (%v: by design)", st.inProgress.Load(), st.slowTimeouts.Load(), slowDownstream())
		if extra := st.timeouts.Load() - st.slowTimeouts.Load(); extra > 0 || st.lockMisses.Load() > 0 {
			why += fmt.Sprintf("; %d other client timeouts and %d lock attempts not obtained in time: the server was slower than "+
				"a client waits (%v): %s", extra, st.lockMisses.Load(), clientTimeout, machineLoad())
		}
		fmt.Println(why)
	}
	fmt.Println()

	// The verdicts, kept apart. Safety is what this demo claims: nothing
	// took effect twice, nothing acknowledged was lost, every balance is
	// right, the stale write was refused. Liveness is what the machine
	// allowed: under load lock attempts and clients time out and retry,
	// which is fine as long as every request is answered within the
	// client's bounds.
	//
	// A request that never completes fails the run too, labelled LIVENESS:
	// the bounds are generous (retryLimit attempts, retryFor), so such a
	// request is stuck (a lock nobody releases, a handler that hangs), and
	// a system that does nothing is trivially safe. Errors that are neither
	// a result nor "not now" fail the run as well: the demo cannot vouch
	// for what it does not understand.
	var unsafe, stuck []string
	missing, err := ledger.verify(work, st.wasAcked)
	if err != nil {
		unsafe = append(unsafe, err.Error())
	}
	if got := ledger.applied.Load(); got > int64(n) {
		unsafe = append(unsafe, fmt.Sprintf("the handler committed %d settlements, want %d", got, n))
	}
	// The frozen holder is the one writer that outlives its lease by
	// design; the fence, not the ledger key, must stop it.
	switch w := svc.frozenWrite.Load(); {
	case w == nil:
		stuck = append(stuck, "the frozen holder never woke up to write: the fence was not put to the test")
	case w.err == nil:
		unsafe = append(unsafe, fmt.Sprintf("%s: the frozen holder's write with fence %d was accepted after fence %d had written",
			svc.stallID, w.fence, w.newer))
	case !errors.Is(w.err, errStaleFence):
		stuck = append(stuck, fmt.Sprintf("the frozen holder's write failed before the fence could refuse it: %v", w.err))
	}
	// A run that committed and then lost its lock (renewals missed under
	// load) may be run again by a retry, and the ledger key stops that
	// duplicate: safe, and expected. Without a lost lock the barrier alone
	// must have kept duplicates out.
	if ids := ledger.duplicates(); len(ids) > 0 {
		var unexplained []string
		for _, id := range ids {
			if !st.lostLock(id) {
				unexplained = append(unexplained, id)
			}
		}
		if len(unexplained) > 0 {
			unsafe = append(unsafe, "duplicates reached the ledger past the barrier although no run of theirs lost its lock: "+
				strings.Join(unexplained, ", "))
		}
	}
	if got := st.fresh.Load() + st.replayed.Load(); got != int64(len(sends)) {
		stuck = append(stuck, fmt.Sprintf("%d of %d requests got no answer; out of retries (%d attempts or %v): %s",
			int64(len(sends))-got, len(sends), retryLimit, retryFor, gaveUp.summary()))
	}
	if len(missing) > 0 {
		stuck = append(stuck, fmt.Sprintf("%d of %d settlements never applied (and no client was told they were): %s",
			len(missing), n, strings.Join(missing[:min(len(missing), 10)], ", ")))
	}
	if unexpected.len() > 0 {
		stuck = append(stuck, "errors that are neither a result nor \"not now\": "+unexpected.summary())
	}
	if ctx.Err() != nil {
		stuck = append(stuck, "interrupted")
	}

	if len(stuck) == 0 {
		fmt.Printf("liveness: all %d requests answered; %d needed retries (at most %d attempts, slowest %.1fs), "+
			"%d attempts timed out, %d lock attempts not obtained in time, %d in-progress conflicts\n",
			len(sends), st.retried.Load(), st.mostAttempts.Load(), time.Duration(st.slowest.Load()).Seconds(),
			st.timeouts.Load(), st.lockMisses.Load(), st.inProgress.Load())
	} else {
		fmt.Println("liveness: FAILED")
		for _, p := range stuck {
			fmt.Println("  - " + p)
		}
	}
	switch {
	case len(unsafe) > 0:
		fmt.Println("safety:   VIOLATED")
		for _, p := range unsafe {
			fmt.Println("  - " + p)
		}
		return errors.New("SAFETY violated")
	case len(stuck) > 0:
		fmt.Printf("safety:   no violation found (nothing applied twice, nothing acknowledged lost, balances equal the "+
			"settlements in the ledger; %d of %d applied), but with liveness failed exactly-once is not shown\n", ledger.applied.Load(), n)
		return errors.New("LIVENESS failed (no safety violation found)")
	}
	w := svc.frozenWrite.Load()
	fmt.Printf("safety:   exactly-once verified (%d settlements, one ledger row each; %d balances equal the exactly-once totals; "+
		"the stale write with fence %d refused after fence %d)\n", n, accounts, w.fence, w.newer)
	return nil
}

// settlement is one business request: move Amount (cents) on Account.
type settlement struct {
	ID      string
	Account string
	Amount  int64
	Slow    bool // its handler calls a slow downstream: clients time out meanwhile
}

// generate makes n settlements, the same every run.
func generate(n int) []settlement {
	rng := mrand.New(mrand.NewPCG(2026, 11))
	work := make([]settlement, n)
	for i := range work {
		work[i] = settlement{
			ID:      fmt.Sprintf("stl-%04d", i),
			Account: fmt.Sprintf("acct-%02d", rng.IntN(accounts)),
			Amount:  rng.Int64N(100_000) - 20_000,
			Slow:    rng.IntN(20) == 0,
		}
	}
	return work
}

// schedule sends every settlement two or three times: for a third of them
// the copies go out back to back (a double click: different clients pick
// them up at the same moment), for the rest they are scattered over the
// run (a retry much later). The first settlement goes out first: it is the
// one whose first holder freezes.
func schedule(work []settlement) []settlement {
	rng := mrand.New(mrand.NewPCG(7, 7))
	var groups [][]settlement
	for _, s := range work {
		copies := 2 + rng.IntN(2)
		if rng.IntN(3) == 0 {
			groups = append(groups, repeat(s, copies))
			continue
		}
		for range copies {
			groups = append(groups, []settlement{s})
		}
	}
	rng.Shuffle(len(groups), func(i, j int) { groups[i], groups[j] = groups[j], groups[i] })
	sends := []settlement{work[0]}
	for _, g := range groups {
		sends = append(sends, g...)
	}
	return sends
}

func repeat(s settlement, n int) []settlement {
	out := make([]settlement, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// service is the server side: what a POST /settlements handler runs.
type service struct {
	barrier  *idempotency.Barrier
	accounts *redlease.Locker
	ledger   *ledger
	stats    *stats
	console  *console

	stallID        string
	froze          atomic.Bool // a holder of stallID took both locks and froze
	frozenBarrier  *idempotency.Barrier
	frozenAccounts *redlease.Locker
	frozenWrite    atomic.Pointer[staleWrite] // what its write came to when it woke up
}

// staleWrite is the frozen holder's write: its fence, the fence that had
// applied the settlement meanwhile, and the ledger's answer (errStaleFence
// is the fence doing its job; nil would be a stale write accepted).
type staleWrite struct {
	fence, newer uint64
	err          error
}

var errStaleFence = errors.New("stale fence: a newer holder has written this account")

// settle runs one request for s through the barrier.
func (svc *service) settle(ctx context.Context, s settlement) (idempotency.Outcome, error) {
	req := idempotency.Request{
		Key: "settlement:" + s.ID,
		// The same id with another account or amount is a client bug, not a
		// retry: the barrier answers ErrMismatch instead of replaying.
		Fingerprint: idempotency.Fingerprint(s.Account, strconv.FormatInt(s.Amount, 10)),
	}
	// Until one holder has frozen, every copy of the first settlement goes
	// the frozen way: under load the first copy may not get its locks, and
	// the scenario must still happen once.
	if s.ID == svc.stallID && !svc.froze.Load() {
		return svc.frozenBarrier.Do(ctx, req, func(ctx context.Context, _ uint64) ([]byte, error) {
			return svc.freeze(ctx, s)
		})
	}
	// The barrier's fence is ignored on purpose: it orders runs of one
	// settlement, not writers of one account (see run).
	out, err := svc.barrier.Do(ctx, req, func(ctx context.Context, _ uint64) ([]byte, error) {
		if s.Slow {
			select { // a fraud check that takes its time
			case <-time.After(slowDownstream()):
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
		var result []byte
		err := svc.accounts.Do(ctx, s.Account, func(ctx context.Context, lk *redlease.Lock) error {
			var err error
			result, err = svc.ledger.apply(ctx, s, lk.Fence())
			return err
		})
		return result, err
	})
	svc.stats.server(s, err)
	return out, err
}

// freeze is the first run of the first settlement, in a process that
// freezes right after taking both locks. Nothing renews them; they expire;
// a client's resend takes the settlement over and applies it under a newer
// account fence. Then the frozen holder wakes up, knows nothing of that
// (it never looked at ctx or lk.Lost), and writes with its old fence.
func (svc *service) freeze(ctx context.Context, s settlement) ([]byte, error) {
	var result []byte
	err := svc.frozenAccounts.Do(ctx, s.Account, func(ctx context.Context, lk *redlease.Lock) error {
		var err error
		if !svc.froze.CompareAndSwap(false, true) {
			// Another copy froze first (both got past settle's check at
			// once, and this one took over the expired locks): this one
			// is just a resend, with a fence of its own.
			result, err = svc.ledger.apply(ctx, s, lk.Fence())
			return err
		}
		svc.console.event("%s: holder with fence %d on %s freezes past its %v lease", s.ID, lk.Fence(), s.Account, stallLease)
		newer, err := svc.ledger.waitApplied(s.ID, retryFor)
		if err != nil {
			return fmt.Errorf("frozen holder: %w", err)
		}
		svc.console.event("%s: a resend took it over and applied it with fence %d; the frozen holder wakes up", s.ID, newer)
		result, err = svc.ledger.apply(context.WithoutCancel(ctx), s, lk.Fence())
		svc.frozenWrite.Store(&staleWrite{fence: lk.Fence(), newer: newer, err: err})
		if errors.Is(err, errStaleFence) {
			svc.console.event("%s: its write with fence %d is rejected by the ledger", s.ID, lk.Fence())
		}
		return err
	})
	return result, err
}

// send is one client sending one copy of s until it gets an answer: the
// result (fresh or replayed). It gives up waiting after clientTimeout, and
// it takes "not now" answers (retryable) the same way: it backs off and
// resends the same request, with the same idempotency key. The attempts it
// gave up on keep running on the server. After retryLimit attempts or
// retryFor it stops, and returns why: a liveness failure.
func (svc *service) send(ctx context.Context, s settlement, pending *sync.WaitGroup, unexpected *errorList) error {
	start := time.Now()
	var last error // why the previous attempt got no answer
	for attempt := 1; ; attempt++ {
		if attempt > retryLimit || time.Since(start) > retryFor {
			return fmt.Errorf("%s: no answer after %d attempts in %.1fs; last: %w",
				s.ID, attempt-1, time.Since(start).Seconds(), last)
		}
		if attempt == 2 {
			svc.stats.retried.Add(1)
		}
		svc.stats.sent.Add(1)
		type answer struct {
			out idempotency.Outcome
			err error
		}
		reply := make(chan answer, 1)
		pending.Go(func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), serverTimeout)
			defer cancel()
			began := time.Now()
			out, err := svc.settle(sctx, s)
			svc.stats.took(time.Since(began), s.Slow)
			if err != nil && !retryable(err) {
				unexpected.add(fmt.Errorf("%s: %w", s.ID, err)) // even if nobody waits for this answer any more
			}
			reply <- answer{out, err}
		})
		select {
		case a := <-reply:
			switch {
			case a.err == nil:
				svc.stats.answered(s.ID, a.out, attempt, time.Since(start))
				return nil
			case !retryable(a.err):
				return nil // already reported as unexpected
			case errors.Is(a.err, idempotency.ErrInProgress):
				svc.stats.inProgress.Add(1) // HTTP would say 409 with Retry-After
			}
			last = a.err
		case <-time.After(clientTimeout):
			svc.stats.timeouts.Add(1)
			if s.Slow {
				svc.stats.slowTimeouts.Add(1)
			}
			last = fmt.Errorf("client timeout: no answer within %v", clientTimeout)
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case <-time.After(backoff(attempt)):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// retryable reports whether an answer means "not now": the request was
// not applied this time (or, if it was, the barrier will replay it), so the
// client may send the same request again. The barrier and the fences make
// that safe; the verdicts at the end check it.
func retryable(err error) bool {
	switch {
	case errors.Is(err, idempotency.ErrInProgress), // another copy runs right now
		errors.Is(err, redlease.ErrNotObtained),  // the lock is held (another copy)
		errors.Is(err, redlease.ErrUnavailable),  // too few lock nodes answered in time (node timeouts under load)
		errors.Is(err, redlease.ErrLost),         // a lock expired under the handler: renewals missed
		errors.Is(err, idempotency.ErrNotOwner),  // ... and a retry took the request over
		errors.Is(err, errStaleFence),            // refused by the ledger, not applied
		errors.Is(err, context.DeadlineExceeded), // the server's own timeout
		errors.Is(err, redis.ErrPoolTimeout):     // too many requests in flight for the connection pool
		return true
	}
	var netErr net.Error
	return errors.As(err, &netErr) && netErr.Timeout()
}

// backoff is a client's wait after its attempt n failed: exponential from
// retryMin, capped at retryMax, with jitter so that the copies of one
// double click do not resend in step. (The barrier's Retry-After hint, a
// second, is meant for remote clients; these back off on their own.)
func backoff(n int) time.Duration {
	d := min(retryMin<<min(n-1, 8), retryMax)
	return d/2 + mrand.N(d/2+1)
}

// ledger is the system of record: SQLite, one transaction per settlement.
type ledger struct {
	db      *sql.DB
	applied atomic.Int64 // settlements committed
	stale   atomic.Int64 // writes refused by the fence check
	already atomic.Int64 // settlements refused by the settlement key
	dups    sync.Map     // ids of those settlements
}

func openLedger(path string) (*ledger, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
	if err != nil {
		return nil, err
	}
	// SQLite has one writer at a time; one connection queues transactions
	// instead of failing them with SQLITE_BUSY.
	db.SetMaxOpenConns(1)
	stmts := []string{
		`CREATE TABLE account (id TEXT PRIMARY KEY, balance INTEGER NOT NULL, fence INTEGER NOT NULL)`,
		`CREATE TABLE settlement (id TEXT PRIMARY KEY, account TEXT NOT NULL REFERENCES account(id), amount INTEGER NOT NULL, fence INTEGER NOT NULL)`,
	}
	for i := range accounts {
		stmts = append(stmts, fmt.Sprintf(`INSERT INTO account VALUES ('acct-%02d', 0, 0)`, i))
	}
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			db.Close()
			return nil, err
		}
	}
	return &ledger{db: db}, nil
}

// apply moves the money and records the settlement, in one transaction,
// only if fence is above the last fence that wrote the account. A stale
// holder changes no row, and the transaction is rolled back.
func (l *ledger) apply(ctx context.Context, s settlement, fence uint64) ([]byte, error) {
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx,
		`UPDATE account SET balance = balance + ?, fence = ? WHERE id = ? AND fence < ?`,
		s.Amount, int64(fence), s.Account, int64(fence))
	if err != nil {
		return nil, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return nil, err
	} else if n == 0 {
		l.stale.Add(1)
		return nil, fmt.Errorf("%s with fence %d on %s: %w", s.ID, fence, s.Account, errStaleFence)
	}
	// The settlement's primary key is the last line of defence: a handler
	// that committed and then lost its record before the barrier stored the
	// result (frozen between the two) would be run again by a retry.
	_, err = tx.ExecContext(ctx, `INSERT INTO settlement (id, account, amount, fence) VALUES (?, ?, ?, ?)`,
		s.ID, s.Account, s.Amount, int64(fence))
	var serr *sqlite.Error
	if errors.As(err, &serr) && serr.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY {
		l.already.Add(1)
		l.dups.Store(s.ID, true)
		return []byte(s.ID + " was already in the ledger"), nil // done before: not an error
	}
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	l.applied.Add(1)
	return fmt.Appendf(nil, "%s: %s %s (fence %d)", s.ID, s.Account, money(s.Amount), fence), nil
}

// waitApplied waits until settlement id is in the ledger and returns the
// fence it was applied with.
func (l *ledger) waitApplied(id string, timeout time.Duration) (uint64, error) {
	for end := time.Now().Add(timeout); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		var fence int64
		err := l.db.QueryRow(`SELECT fence FROM settlement WHERE id = ?`, id).Scan(&fence)
		if err == nil {
			return uint64(fence), nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return 0, err
		}
	}
	return 0, fmt.Errorf("%s was not applied by anyone else within %v: %w", id, timeout, context.DeadlineExceeded)
}

// duplicates returns the ids of the settlements that the settlement key
// refused, sorted.
func (l *ledger) duplicates() []string {
	var ids []string
	l.dups.Range(func(id, _ any) bool {
		ids = append(ids, id.(string))
		return true
	})
	slices.Sort(ids)
	return ids
}

// verify compares the ledger with the settlements that were sent and with
// what the clients were told. Its error lists the safety problems: a
// settlement applied twice, or as something else than was sent; one that a
// client was told is done but is not in the ledger; a balance that is not
// the sum of its account's settlements in the ledger, each once. It returns
// apart the settlements never applied that no client was told are done:
// missing, but a liveness matter. With none missing, the balances checked
// are the exactly-once totals.
func (l *ledger) verify(work []settlement, acked func(id string) bool) (missing []string, err error) {
	want := make(map[string]settlement, len(work))
	for _, s := range work {
		want[s.ID] = s
	}
	var problems []string
	balance := make(map[string]int64) // per account, its settlements in the ledger, once each
	rows, err := l.db.Query(`SELECT id, account, amount FROM settlement`)
	if err != nil {
		return nil, err
	}
	seen := make(map[string]bool)
	for rows.Next() {
		var id, account string
		var amount int64
		if err := rows.Scan(&id, &account, &amount); err != nil {
			rows.Close()
			return nil, err
		}
		w, ok := want[id]
		switch {
		case seen[id]:
			problems = append(problems, id+" applied more than once")
		case !ok:
			problems = append(problems, id+" applied but never sent")
		case w.Account != account || w.Amount != amount:
			problems = append(problems, fmt.Sprintf("%s applied as %s %d, sent as %s %d", id, account, amount, w.Account, w.Amount))
		default:
			balance[w.Account] += w.Amount
		}
		seen[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, s := range work {
		switch {
		case seen[s.ID]:
		case acked(s.ID):
			problems = append(problems, s.ID+" acknowledged as done but not in the ledger")
		default:
			missing = append(missing, s.ID)
		}
	}
	rows, err = l.db.Query(`SELECT id, balance FROM account ORDER BY id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var got int64
		if err := rows.Scan(&id, &got); err != nil {
			return nil, err
		}
		if got != balance[id] {
			problems = append(problems, fmt.Sprintf("%s balance %d, but its settlements in the ledger add up to %d", id, got, balance[id]))
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(problems) == 0 {
		return missing, nil
	}
	if len(problems) > 10 {
		problems = append(problems[:10], fmt.Sprintf("… and %d more", len(problems)-10))
	}
	return missing, errors.New("the ledger differs from the settlements sent:\n    " + strings.Join(problems, "\n    "))
}

// stats is what the clients saw, and what went wrong on the server side
// of their attempts.
type stats struct {
	sent, fresh, replayed, inProgress, timeouts atomic.Int64
	slowTimeouts                                atomic.Int64 // timeouts of a slow downstream's settlement: by design

	latMu sync.Mutex
	lat   []time.Duration // server-side time of every attempt whose handler has no slow downstream

	// Liveness figures.
	retried      atomic.Int64 // requests that needed more than one attempt
	mostAttempts atomic.Int64 // attempts of the request that needed most
	slowest      atomic.Int64 // time to an answer of the slowest request (ns)
	lockMisses   atomic.Int64 // attempts whose lock was not obtained in time
	lost         atomic.Int64 // attempts whose lock was lost under the handler

	acked    sync.Map // settlement ids some client was told are done
	lostRuns sync.Map // settlement ids with an attempt that lost its lock
}

// answered records a request's answer, after attempts, at elapsed.
func (st *stats) answered(id string, out idempotency.Outcome, attempts int, elapsed time.Duration) {
	if out.Replayed {
		st.replayed.Add(1)
	} else {
		st.fresh.Add(1)
	}
	st.acked.Store(id, true)
	storeMax(&st.mostAttempts, int64(attempts))
	storeMax(&st.slowest, int64(elapsed))
}

// server records a failed attempt's cause, whether or not a client still
// waited for it.
func (st *stats) server(s settlement, err error) {
	switch {
	case errors.Is(err, redlease.ErrLost), errors.Is(err, idempotency.ErrNotOwner):
		st.lost.Add(1)
		st.lostRuns.Store(s.ID, true)
	case errors.Is(err, redlease.ErrNotObtained), errors.Is(err, redlease.ErrUnavailable):
		st.lockMisses.Add(1)
	}
}

// took records how long the server took for one attempt.
func (st *stats) took(d time.Duration, slow bool) {
	if slow {
		return
	}
	st.latMu.Lock()
	st.lat = append(st.lat, d)
	st.latMu.Unlock()
}

// latency returns the median, 99th percentile and maximum server-side
// time of attempts without a slow downstream, and how many of them took
// longer than the client waits.
func (st *stats) latency() (p50, p99, most time.Duration, over int) {
	st.latMu.Lock()
	defer st.latMu.Unlock()
	if len(st.lat) == 0 {
		return 0, 0, 0, 0
	}
	l := slices.Clone(st.lat)
	slices.Sort(l)
	for _, d := range l {
		if d > clientTimeout {
			over++
		}
	}
	return l[len(l)/2], l[len(l)*99/100], l[len(l)-1], over
}

func (st *stats) wasAcked(id string) bool { _, ok := st.acked.Load(id); return ok }
func (st *stats) lostLock(id string) bool { _, ok := st.lostRuns.Load(id); return ok }

func storeMax(a *atomic.Int64, v int64) {
	for old := a.Load(); v > old && !a.CompareAndSwap(old, v); old = a.Load() {
	}
}

func (st *stats) line(l *ledger, n int) string {
	return fmt.Sprintf("sent %5d   applied %4d/%d   replayed %5d   in progress %4d   timed out %4d   stale rejected %d",
		st.sent.Load(), l.applied.Load(), n, st.replayed.Load(), st.inProgress.Load(), st.timeouts.Load(), l.stale.Load())
}

// errorList collects errors from many goroutines.
type errorList struct {
	mu   sync.Mutex
	errs []error
}

func (l *errorList) add(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, err)
}

func (l *errorList) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.errs)
}

// summary is "n; first: err", or "none".
func (l *errorList) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.errs) == 0 {
		return "none"
	}
	return fmt.Sprintf("%d; first: %v", len(l.errs), l.errs[0])
}

// console shows progress and prints events. On a terminal it keeps one
// live status line (redrawn with \r, ten times a second) and prints events
// above it; anywhere else (a pipe, a CI log) it prints the status as a plain
// line every plainEvery, and events as they come, never a \r.
type console struct {
	tty  bool // stdout is a terminal
	mu   sync.Mutex
	last int // length of the status line on screen
}

// plainEvery is how often the status line is printed when stdout is not a
// terminal.
const plainEvery = 5 * time.Second

func (c *console) draw(line string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.tty {
		fmt.Println(line)
		return
	}
	fmt.Printf("\r%-*s", c.last, line)
	c.last = len(line)
}

func (c *console) event(format string, args ...any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.tty {
		fmt.Printf(format+"\n", args...)
		return
	}
	fmt.Printf("\r%-*s\r%s\n", c.last, "", fmt.Sprintf(format, args...))
	c.last = 0
}

// progress draws line() every 100 ms on a terminal (every plainEvery
// elsewhere) until the returned stop is called, which draws it a last time
// and ends the status line.
func (c *console) progress(line func() string) (stop func()) {
	every := 100 * time.Millisecond
	if !c.tty {
		every = plainEvery
	}
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				c.draw(line())
			case <-done:
				c.draw(line())
				if c.tty {
					fmt.Println()
				}
				return
			}
		}
	}()
	return func() { close(done); <-exited }
}

// stdoutIsTerminal reports whether stdout is a terminal (a character
// device: /dev/null counts too, where a \r does no harm).
func stdoutIsTerminal() bool {
	fi, err := os.Stdout.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// machineLoad describes how busy the machine was: the 1-minute load
// average against the CPUs (Linux), else the CPU count.
func machineLoad() string {
	cpus := runtime.NumCPU()
	b, err := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if err != nil || len(f) == 0 {
		return fmt.Sprintf("servers, clients and SQLite share %d CPUs in this process; try -client-timeout or fewer -clients", cpus)
	}
	load, _ := strconv.ParseFloat(f[0], 64)
	if load > float64(cpus) {
		return fmt.Sprintf("load average %.1f on %d CPUs: other processes compete with the in-process servers", load, cpus)
	}
	return fmt.Sprintf("load average %.1f on %d CPUs; servers, clients and SQLite share them in this process "+
		"(try -client-timeout or fewer -clients)", load, cpus)
}

// env is where the locks and records live.
type env struct {
	nodes             []redis.UniversalClient
	store             redis.UniversalClient
	where, storeWhere string
	closers           []func()
}

func (e *env) close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// connect returns clients for the given addresses, or for in-process
// servers (five lock nodes, one store) where none are given.
func connect(nodeList, storeAddr string) (*env, error) {
	e := &env{where: nodeList, storeWhere: storeAddr}
	dial := func(addr string) redis.UniversalClient {
		c := redis.NewClient(&redis.Options{Addr: strings.TrimSpace(addr), ContextTimeoutEnabled: true})
		e.closers = append(e.closers, func() { _ = c.Close() })
		return c
	}
	addrs := strings.Split(nodeList, ",")
	if nodeList == "" {
		addrs = nil
		for range 5 {
			addr, err := e.inProcess()
			if err != nil {
				e.close()
				return nil, err
			}
			addrs = append(addrs, addr)
		}
		e.where = "5 in-process nodes"
	}
	for _, a := range addrs {
		e.nodes = append(e.nodes, dial(a))
	}
	if storeAddr == "" {
		addr, err := e.inProcess()
		if err != nil {
			e.close()
			return nil, err
		}
		storeAddr, e.storeWhere = addr, "an in-process store"
	}
	e.store = dial(storeAddr)
	return e, nil
}

// inProcess starts a miniredis whose keys expire as the wall clock runs,
// as on a real server. By default miniredis expires keys only when told to
// (FastForward), which would keep every lease here alive forever, and one
// big jump on all servers would expire every lease at once, not just the
// frozen holder's. So every expiryStep each server is forwarded by the
// time that has passed: a key lives at most a step (and a late tick)
// longer than its TTL, never shorter, which is the safe side for a lock.
// (miniredis's ClockTTL does the same on every command, but each forward
// sorts all the server's keys: with every lock script's commands doing it,
// that was a quarter of the demo's CPU.)
func (e *env) inProcess() (string, error) {
	m, err := miniredis.Run()
	if err != nil {
		return "", err
	}
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(expiryStep)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				now := time.Now()
				m.FastForward(now.Sub(last))
				last = now
			}
		}
	}()
	e.closers = append(e.closers, m.Close, func() { close(stop); <-stopped }) // closed in reverse
	return m.Addr(), nil
}

// expiryStep is how often the in-process servers' keys age.
const expiryStep = 5 * time.Millisecond

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// money formats cents: -1234 is "-12.34".
func money(cents int64) string {
	sign := "+"
	if cents < 0 {
		sign, cents = "-", -cents
	}
	return fmt.Sprintf("%s%d.%02d", sign, cents/100, cents%100)
}
