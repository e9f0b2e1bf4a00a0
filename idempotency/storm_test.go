package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/renew"
)

// The storm's size and seed. `make test` runs the default size, which fits
// in a few seconds with -race on a 2-core machine; the full size is
//
//	go test -race -count=1 -run Storm ./idempotency/ -storm.payments=1000
//
// and a run's random draws (not its interleaving) are replayed with the
// seed it logged: -storm.seed=N.
var (
	stormPayments = flag.Int("storm.payments", 200, "payments in TestStormOfRetriesChargesEachPaymentOnce (the issue's full size: 1000)")
	stormSeed     = flag.Uint64("storm.seed", 0, "seed of the storm's random draws (0: from the clock)")
)

// The storm's shape.
const (
	stormClients      = 3                      // concurrent clients per payment
	stormInFlight     = 50                     // payments in flight at once
	stormRetention    = 3 * time.Second        // short, so the store empties within the test
	stormLease        = time.Second            // renewed by a Watchdog while a handler runs
	stormTimeoutMin   = 50 * time.Millisecond  // a client's per-request timeout: 50–150 ms,
	stormTimeoutSpan  = 100 * time.Millisecond // then 1.5 times longer per attempt
	stormPatientAfter = 10                     // past the tenth (see stormTimeout),
	stormTimeoutMax   = 5 * time.Second        // up to this
	stormChargeMin    = 20 * time.Millisecond  // the handler's provider call: 20–200 ms
	stormChargeSpan   = 180 * time.Millisecond //
	stormPause        = 300 * time.Millisecond // each SIGSTOP of the store
	stormBackoffFirst = 20 * time.Millisecond  // a client's backoff: doubling, jittered, capped
	stormBackoffMax   = 320 * time.Millisecond //
	stormMaxAttempts  = 150                    // per client
	stormClientBudget = 30 * time.Second       // per client, from its first request, plus 3 × the stall measured meanwhile
)

// stormTimeout draws a client's timeout for its attempt-th request
// (counted from 1): 50–150 ms, times 1.5 for every attempt past the
// stormPatientAfter-th, at most stormTimeoutMax. Impatient at first, as
// the storm needs; patient later, as a real client that backs off is. With
// the first draw for every attempt, a machine too busy to answer any
// request within 150 ms (a cold build of other packages beside the test,
// -race) made every attempt of every client time out while the server
// still ran the abandoned ones: no payment was charged for 22 s, and a
// client ran out of its budget (make test with an empty build cache).
func stormTimeout(rng *rand.Rand, attempt int) time.Duration {
	d := stormTimeoutMin + time.Duration(rng.Int64N(int64(stormTimeoutSpan)+1))
	for k := stormPatientAfter; k < attempt && d < stormTimeoutMax; k++ {
		d = d * 3 / 2
	}
	return min(d, stormTimeoutMax)
}

// stormBudgetOver says how a client's budget was derived once it has run
// out, and "" while the client that began at start may still try: for
// stormClientBudget plus 3 × what probe measured this process stalled
// since start (the window is derived from the run).
func stormBudgetOver(probe *redistest.StallProbe, start time.Time) string {
	now := time.Now()
	if now.Sub(start) < probe.Allowance(stormClientBudget, 3, start, now) {
		return ""
	}
	return probe.Explain(stormClientBudget, 3, start, now)
}

// TestStormOfRetriesChargesEachPaymentOnce is the storm: payments
// through the real Middleware on a real listener, each sent by three
// impatient clients at once (per-request timeouts of 50–150 ms, shorter
// than many handler runs), every client retrying with the payment's
// Idempotency-Key until it gets a final answer, while the store is paused
// twice for 300 ms. The handler charges through a ledger that, like a real
// payments table, refuses a second charge for a payment id (and answers
// with the existing charge) and refuses a run under an older fence than
// one it has seen.
//
// It checks: every payment charged exactly once; every client of a
// payment got that payment's charge; the payment's record completed once
// its clients were answered; every second charge the ledger refused
// explained (the record's retention had passed, or an earlier run of the
// payment was cancelled or not recorded); no record left in progress and
// no key without a TTL after the run; and the store empty once
// retention+lease have passed.
func TestStormOfRetriesChargesEachPaymentOnce(t *testing.T) {
	wireNoLeaks(t)
	n, seed := stormSize(t)
	t.Logf("storm: %d payments × %d clients, seed %d (replay the draws with -storm.seed=%d)", n, stormClients, seed, seed)

	srv, admin, storeClient, cmds, w := stormStore(t)
	b, err := idempotency.New(storeClient,
		idempotency.WithRetention(stormRetention),
		idempotency.WithLease(stormLease),
		idempotency.WithKeeper(w))
	require.NoError(t, err)

	s := &storm{seed: seed, ledger: &stormLedger{entries: map[string]*ledgerEntry{}}, probe: redistest.StartStallProbe(t)}
	mw2, err := idempotency.Middleware(b, idempotency.WithGlobalKeys(),
		idempotency.WithRoute(func(*http.Request) string { return "POST /payments" }),
		idempotency.WithErrorLog(s.errorLog),
	)
	require.NoError(t, err)
	mw := mw2(http.HandlerFunc(s.pay))
	served := &stormLatencies{}
	var departed atomic.Int32 // requests whose client had left when they were answered
	ts := wireServe(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		r = r.WithContext(context.WithValue(r.Context(), stormSendKey{}, &stormSend{}))
		mw.ServeHTTP(w, r)
		served.add(time.Since(start))
		if r.Context().Err() != nil {
			departed.Add(1)
		}
	}))

	// The run: stormInFlight payments at a time, and the two pauses once a
	// fifth and three fifths of the payments have been answered to all
	// their clients (mid-storm at any size).
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute+time.Duration(n)*100*time.Millisecond)
	defer cancel()
	var pauseLog []string
	payments := make([]*stormPayment, n)
	sem := make(chan struct{}, stormInFlight)
	var clients sync.WaitGroup
	s.start = time.Now()
	pauser := startStormPauser(srv, n, func(at, _ time.Time) {
		pauseLog = append(pauseLog, fmt.Sprintf("%.2fs", at.Sub(s.start).Seconds()))
	})
	for i := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			t.Fatalf("storm: payment %d not started: %v", i, context.Cause(ctx))
		}
		p := newStormPayment(i, seed)
		payments[i] = p
		var pending atomic.Int32
		pending.Store(stormClients)
		for c := range p.results {
			clients.Go(func() {
				p.results[c] = s.client(ctx, ts.URL+"/payments", p, c)
				if pending.Add(-1) == 0 {
					p.record, p.recordAt = stormRecordOf(ctx, admin, p), time.Now()
					pauser.answered()
					<-sem
				}
			})
		}
	}
	clients.Wait()
	pauser.stop()
	runTime := time.Since(s.start)
	// Handlers of requests whose clients timed out may still run; Close
	// waits for them, so that the store is read after every run ended.
	ts.Close()
	drained := time.Now()

	// Every payment charged once, every client got that charge, and the
	// payment's record was completed once they had it.
	var tot stormTotals
	for _, p := range payments {
		e := s.ledger.entry(p.id)
		if !assert.NotNil(t, e, "%s: never reached the ledger", p.id) {
			continue
		}
		assert.Equal(t, 1, e.applied, "%s: charges applied (ledger: %+v)", p.id, *e)
		switch {
		case p.record.state == "p" && s.logged(p.id, logNotRecorded):
			// Its clients had the response of a run that could not record
			// it: the record stays in progress until a retry takes it
			// over, or until it expires (ErrNotRecorded).
		case p.record.state == "" && p.recordAt.Sub(e.appliedAt) >= stormRetention:
			// Kept a retention from its completion, which came after the
			// charge: it may be gone.
		default:
			assert.Equal(t, "c", p.record.state, "%s: its record once all its clients were answered (%s)", p.id, p.record)
			assert.True(t, p.record.ttl >= 0 && p.record.ttl <= stormRetention, "%s: its record's TTL once all its clients were answered (%s)", p.id, p.record)
		}
		for c, r := range p.results {
			tot.add(r)
			if assert.True(t, r.final, "%s client %d: no final answer after %d attempts: %s (budget: %s)", p.id, c, r.attempts, r.last, r.budget) &&
				assert.Equal(t, http.StatusCreated, r.status, "%s client %d: final answer %s", p.id, c, r.last) {
				assert.Equal(t, p.id, r.payment, "%s client %d: the response is another payment's: %s", p.id, c, r.last)
				assert.Equal(t, e.charge, r.charge, "%s client %d: the response is not the payment's charge: %s", p.id, c, r.last)
			}
		}
	}
	assert.Empty(t, tot.odd, "answers no client should get (a 5xx other than 503, an error other than a timeout)")
	assert.Empty(t, s.otherLogs(), "error log lines of no expected kind")
	led := s.ledger.totals()
	assert.Equal(t, n, led.applied, "charges applied: one per payment")
	assert.Equal(t, led.runs, led.applied+led.dups+led.stale, "every run applied its charge or was refused")
	assert.Zero(t, s.unfenced.Load(), "handler runs without a fence")
	refusals := s.refusals()
	causes := map[string]int{}
	for _, r := range refusals {
		causes[r.cause]++
		assert.NotEqual(t, causeUnexplained, r.cause, "a second charge nothing explains: %s", r)
	}

	// Right after the run: completed records, fence counters and perhaps a
	// lock an unrecorded run kept; each with a TTL, no record in progress.
	keys := stormScan(t, admin)
	paymentOf := map[string]string{}
	for _, p := range payments {
		paymentOf[p.record.key] = p.id
	}
	counts := map[string]int{}
	for _, k := range keys {
		counts[k.kind]++
		switch k.kind {
		case "record":
			if id := paymentOf[k.key]; k.state != "p" || !s.logged(id, logNotRecorded) { // see above
				assert.Equal(t, "c", k.state, "record %s (%s) is not completed", k.key, id)
			}
			assert.True(t, k.ttl >= 0 && k.ttl <= stormRetention, "record %s: TTL %v, want [0, %v] (PTTL 0: under a millisecond left)", k.key, k.ttl, stormRetention)
		case "lock":
			assert.True(t, k.ttl >= 0 && k.ttl <= stormLease, "lock %s: TTL %v, want [0, %v] (PTTL 0: under a millisecond left)", k.key, k.ttl, stormLease)
		case "fence":
			assert.True(t, k.ttl >= 0 && k.ttl <= stormRetention+stormLease, "fence counter %s: TTL %v, want [0, %v] (PTTL 0: under a millisecond left)", k.key, k.ttl, stormRetention+stormLease)
		default:
			assert.Fail(t, "a key that is neither record, lock nor fence counter", "%s (TTL %v)", k.key, k.ttl)
		}
	}
	// Records of payments answered more than a retention ago are gone.
	assert.LessOrEqual(t, counts["record"], n, "records: at most one per payment")
	assert.LessOrEqual(t, counts["fence"], n, "fence counters: at most one per payment")

	// Then nothing: records go a retention after completion, fence counters
	// retention+lease after their last grant, which came before drained.
	emptyBy := drained.Add(stormRetention + stormLease + 2*time.Second)
	var left []stormKey
	for {
		left = stormScan(t, admin)
		if len(left) == 0 || time.Now().After(emptyBy) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	assert.Empty(t, left, "keys left retention+lease (+2 s) after the last run")
	emptied := time.Since(drained)

	ps := storeClient.PoolStats()
	t.Logf("storm: run %.2fs (pauses at %s), store empty %.2fs after the last handler, wall %.2fs",
		runTime.Seconds(), strings.Join(pauseLog, ", "), emptied.Seconds(), time.Since(s.start).Seconds())
	t.Logf("storm: clients %d, requests %d, retries %d, 409 in-progress %d, 503 store-unavailable %d, 503 outcome-unknown %d, other 503 %d, timeouts %d, other errors %d; final 201s fresh %d, replayed %d; most attempts of a client %d",
		tot.clients, tot.requests, tot.requests-tot.clients, tot.inProgress, tot.unavailable, tot.outcomeUnknown, tot.other503, tot.timeouts, tot.errors, tot.fresh, tot.replayed, tot.maxAttempts)
	t.Logf("storm: handler runs %d, charges applied %d, second charges refused %d (duplicate %d, stale fence %d) by cause %v; error log %s",
		led.runs, led.applied, led.dups+led.stale, led.dups, led.stale, causes, s.logSummary())
	t.Logf("storm: keys after the run %v; requests served %s, %d of them after their client left; store commands %s; pool waits %d (%v), pool timeouts %d",
		counts, served, departed.Load(), cmds, ps.WaitCount, time.Duration(ps.WaitDurationNs).Round(time.Millisecond), ps.Timeouts)
	for i, r := range refusals {
		if i == 10 {
			t.Logf("storm: … %d more refusals", len(refusals)-i)
			break
		}
		t.Logf("storm: refused: %s", r)
	}
	for _, a := range tot.odd {
		t.Logf("storm: a client got: %s", a)
	}
	for _, l := range s.otherLogs() {
		t.Logf("storm: error log: %s", l)
	}
	for _, kind := range []string{logNotRecorded, logLockLost, logCancelled, logTold} {
		for _, l := range s.samples(kind, 2) {
			t.Logf("storm: error log, %s: %s", kind, l)
		}
	}
}

// storm is the server side: the payment handler, its ledger, and what the
// middleware reported.
type storm struct {
	seed     uint64
	start    time.Time
	ledger   *stormLedger
	unfenced atomic.Int32
	probe    *redistest.StallProbe // the clients' budgets are derived from what it measures

	mu   sync.Mutex
	logs map[string][]stormLog // the error log, by payment id
	kind map[string]int        // the error log, by kind
	odd  []string              // the error log's lines of kind "other"
}

type stormLog struct {
	at    time.Time
	kind  string
	err   error
	fence uint64 // the fence of the run the line is about; 0: no run began
}

// stormSend is one request as the server saw it: the fence its handler
// ran under (0 if none ran), so that a line of the middleware's error log
// names the run it is about.
type stormSend struct{ fence atomic.Uint64 }

type stormSendKey struct{}

// stormSendFence is the fence of the run r's handler began (0 if none).
func stormSendFence(r *http.Request) uint64 {
	if sd, ok := r.Context().Value(stormSendKey{}).(*stormSend); ok {
		return sd.fence.Load()
	}
	return 0
}

// stormPaymentBody is a payment request, and stormReceipt the handler's
// answer.
type stormPaymentBody struct {
	Payment string `json:"payment"`
	Amount  int    `json:"amount"`
}

type stormReceipt struct {
	Payment string `json:"payment"`
	Charge  string `json:"charge"`
	Amount  int    `json:"amount"`
}

// pay is a payment handler: it reads its fence, marks the payment with it,
// calls the "provider" (20–200 ms, not cancellable: a call on its way
// cannot be taken back) and charges through the ledger under its fence. It
// does not look at its context before charging, as a paused process would
// not: the ledger is what refuses a run that outlived its lock.
func (s *storm) pay(w http.ResponseWriter, r *http.Request) {
	fence, ok := idempotency.FenceFrom(r.Context())
	if !ok {
		s.unfenced.Add(1)
		http.Error(w, "no fence", http.StatusInternalServerError)
		return
	}
	var p stormPaymentBody
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Payment == "" {
		http.Error(w, "bad payment", http.StatusBadRequest)
		return
	}
	// When the run is told its lock is gone (its ctx cancelled with
	// ErrLost), whatever happens to the middleware's log line later: a
	// successor may only begin after that (the lock's Lost closes a loss
	// margin before its validity ends, and the store grants nobody else
	// before it does).
	ctx := r.Context()
	if sd, ok := ctx.Value(stormSendKey{}).(*stormSend); ok {
		sd.fence.Store(fence)
	}
	context.AfterFunc(ctx, func() {
		if cause := context.Cause(ctx); errors.Is(cause, redlease.ErrLost) {
			s.log(p.Payment, logTold, cause, fence)
		}
	})
	run := &stormRun{fence: fence, began: time.Now()}
	if !s.ledger.begin(p.Payment, run) {
		http.Error(w, "superseded by a newer run", http.StatusInternalServerError)
		return
	}
	rng := rand.New(rand.NewPCG(s.seed, fnv64(p.Payment)^fence<<48))
	time.Sleep(stormChargeMin + time.Duration(rng.Int64N(int64(stormChargeSpan)+1)))
	charge, res := s.ledger.commit(p.Payment, run)
	if res == chargeStale {
		http.Error(w, "superseded by a newer run", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/charges/"+charge)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(stormReceipt{Payment: p.Payment, Charge: charge, Amount: p.Amount})
}

// Kinds of error log lines.
const (
	logLockLost    = "run cancelled (lock lost)"
	logCancelled   = "run cancelled (other cause)"
	logNotRecorded = "not recorded"
	logStoreDown   = "store unavailable"
	logOther       = "other"
	// logTold is not the middleware's: the handler's ctx was cancelled
	// because its lock was lost (recorded when it happened).
	logTold = "told: lock lost"
)

// errorLog keeps what the middleware reported, by payment (the key names
// it) and by kind.
func (s *storm) errorLog(r *http.Request, err error) {
	kind := logOther
	switch {
	case errors.Is(err, idempotency.ErrRunCancelled) && errors.Is(err, redlease.ErrLost):
		kind = logLockLost
	case errors.Is(err, idempotency.ErrRunCancelled):
		kind = logCancelled
	case errors.Is(err, idempotency.ErrNotRecorded):
		kind = logNotRecorded
	case strings.HasPrefix(err.Error(), "idempotency: store unavailable"): // the middleware's own words, for the tally only
		kind = logStoreDown
	}
	id := stormPaymentOfKey(r.Header.Get(idempotency.HeaderIdempotencyKey))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kind == nil {
		s.kind, s.logs = map[string]int{}, map[string][]stormLog{}
	}
	s.kind[kind]++
	if kind == logOther && len(s.odd) < 20 {
		s.odd = append(s.odd, err.Error())
	}
	if kind != logStoreDown {
		s.logs[id] = append(s.logs[id], stormLog{at: time.Now(), kind: kind, err: err, fence: stormSendFence(r)})
	}
}

// log records a line of kind for payment id (the handler's own record of
// when it was told its lock was lost).
func (s *storm) log(id, kind string, err error, fence uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kind == nil {
		s.kind, s.logs = map[string]int{}, map[string][]stormLog{}
	}
	s.kind[kind]++
	s.logs[id] = append(s.logs[id], stormLog{at: time.Now(), kind: kind, err: err, fence: fence})
}

func (s *storm) logSummary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.kind) == 0 {
		return "empty"
	}
	return fmt.Sprint(s.kind)
}

// logged reports whether the error log has a line of kind for payment id.
func (s *storm) logged(id, kind string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.ContainsFunc(s.logs[id], func(l stormLog) bool { return l.kind == kind })
}

// samples returns the first n lines of the error log of kind.
func (s *storm) samples(kind string, n int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, id := range slices.Sorted(maps.Keys(s.logs)) {
		for _, l := range s.logs[id] {
			if l.kind == kind && len(out) < n {
				out = append(out, fmt.Sprintf("%s at %.2fs: %v", id, l.at.Sub(s.start).Seconds(), l.err))
			}
		}
	}
	return out
}

func (s *storm) otherLogs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.odd)
}

// Causes of a second charge the ledger refused.
const (
	causeRetention   = "after the record's retention"
	causeCancelled   = "after a cancelled run"
	causeNotRecorded = "after an unrecorded run"
	causeUnexplained = "unexplained"
)

// stormRefusal is a second charge the ledger refused, and why a second run
// of the payment happened at all.
type stormRefusal struct {
	payment string
	run     stormRun
	charge  string // the payment's charge
	applied time.Time
	cause   string
	start   time.Time
	logs    []stormLog
}

func (r stormRefusal) String() string {
	what := "already charged (" + r.charge + ")"
	if r.run.stale {
		what = fmt.Sprintf("stale: fence %d < %d", r.run.fence, r.run.highest)
	}
	var logs []string
	for _, l := range r.logs {
		logs = append(logs, fmt.Sprintf("%.2fs %s (fence %d)", l.at.Sub(r.start).Seconds(), l.kind, l.fence))
	}
	return fmt.Sprintf("%s: run with fence %d began %.2fs (charged %.2fs): %s; %s; middleware log %v",
		r.payment, r.run.fence, r.run.began.Sub(r.start).Seconds(), r.applied.Sub(r.start).Seconds(), what, r.cause, logs)
}

// refusals lists every refused second charge with its cause: a run that
// began a retention or more after the charge may have found the record
// gone (it is kept a retention from its completion, which came after the
// charge); otherwise an earlier run of the payment must have been
// cancelled or not recorded, and the middleware's log says so. A log line
// is about the run its request's handler began: it explains a run with a
// higher fence whenever it was written (a run's lease may end, and its
// successor begin, before the line that reports it is written). A line
// whose request began no run explains only runs that began after it.
func (s *storm) refusals() []stormRefusal {
	s.mu.Lock()
	logs := map[string][]stormLog{}
	for id, l := range s.logs {
		logs[id] = slices.Clone(l)
	}
	s.mu.Unlock()
	var out []stormRefusal
	for _, id := range s.ledger.ids() {
		e := s.ledger.entry(id)
		for _, run := range e.refused {
			r := stormRefusal{payment: id, run: run, charge: e.charge, applied: e.appliedAt, start: s.start, logs: logs[id], cause: causeUnexplained}
			earlier := func(l stormLog) bool { // about a run before this one
				if l.fence != 0 {
					return l.fence < run.fence
				}
				return l.at.Before(run.began)
			}
			switch {
			case e.charge != "" && run.began.Sub(e.appliedAt) >= stormRetention:
				r.cause = causeRetention
			case slices.ContainsFunc(logs[id], func(l stormLog) bool {
				return earlier(l) && (l.kind == logLockLost || l.kind == logCancelled || l.kind == logTold)
			}):
				r.cause = causeCancelled
			case slices.ContainsFunc(logs[id], func(l stormLog) bool { return earlier(l) && l.kind == logNotRecorded }):
				r.cause = causeNotRecorded
			case run.stale:
				// A run refused for its fence was overtaken by a newer one:
				// whatever started that newer run explains this one too.
				if slices.ContainsFunc(logs[id], func(l stormLog) bool {
					return l.kind == logLockLost || l.kind == logCancelled || l.kind == logNotRecorded || l.kind == logTold
				}) {
					r.cause = causeCancelled
				}
			}
			out = append(out, r)
		}
	}
	return out
}

// stormLedger is the handler's own storage, as a payments table would be:
// one row per payment id with the highest fence that touched it and at
// most one charge (a unique constraint). It counts every run, applied or
// refused.
type stormLedger struct {
	mu      sync.Mutex
	entries map[string]*ledgerEntry
}

type ledgerEntry struct {
	fence     uint64 // the highest fence seen
	charge    string // "" until charged
	appliedAt time.Time
	applied   int // charges applied: must end at 1
	runs      int // runs that began
	refused   []stormRun
}

// stormRun is one run of the handler, as the ledger saw it.
type stormRun struct {
	fence   uint64
	began   time.Time
	stale   bool   // refused for its fence (else: already charged)
	highest uint64 // the row's fence when it was refused
}

type chargeResult int

const (
	chargeApplied   chargeResult = iota
	chargeDuplicate              // already charged: refused, the charge returned
	chargeStale                  // a newer run touched the row: refused
)

// begin marks the row with the run's fence before the provider is called
// (UPDATE … SET fence = f WHERE fence <= f), so that an older run still on
// its way is refused when it commits. It reports false if a newer run
// began already. A charged payment takes any run: its commit returns the
// charge (fences start again at 1 once a request's fence counter expired,
// retention+lease after its last grant, so a late retry may carry a
// fence lower than the row's).
func (l *stormLedger) begin(id string, run *stormRun) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entries[id]
	if e == nil {
		e = &ledgerEntry{}
		l.entries[id] = e
	}
	e.runs++
	switch {
	case e.charge != "":
		return true
	case run.fence < e.fence:
		run.stale, run.highest = true, e.fence
		e.refused = append(e.refused, *run)
		return false
	}
	e.fence = run.fence
	return true
}

// commit charges, once per payment: a payment already charged refuses a
// second charge and returns the existing one, as a handler answers with
// it; a run under an older fence than the row's is refused.
func (l *stormLedger) commit(id string, run *stormRun) (string, chargeResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entries[id]
	switch {
	case e.charge != "":
		run.highest = e.fence
		e.refused = append(e.refused, *run)
		return e.charge, chargeDuplicate
	case run.fence < e.fence:
		run.stale, run.highest = true, e.fence
		e.refused = append(e.refused, *run)
		return "", chargeStale
	}
	e.charge = fmt.Sprintf("ch-%s-f%d", id, run.fence)
	e.appliedAt = time.Now()
	e.applied++
	return e.charge, chargeApplied
}

func (l *stormLedger) entry(id string) *ledgerEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.entries[id]
	if e == nil {
		return nil
	}
	c := *e
	c.refused = slices.Clone(e.refused)
	return &c
}

func (l *stormLedger) ids() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]string, 0, len(l.entries))
	for id := range l.entries {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

type ledgerTotals struct{ applied, dups, stale, runs int }

func (l *stormLedger) totals() ledgerTotals {
	l.mu.Lock()
	defer l.mu.Unlock()
	var t ledgerTotals
	for _, e := range l.entries {
		t.applied += e.applied
		t.runs += e.runs
		for _, r := range e.refused {
			if r.stale {
				t.stale++
			} else {
				t.dups++
			}
		}
	}
	return t
}

// stormPayment is one payment and what each of its clients got.
type stormPayment struct {
	id, key, body string
	seed          uint64
	index         int
	results       [stormClients]stormResult
	record        stormKey  // read once all its clients were answered
	recordAt      time.Time // when
}

func newStormPayment(i int, seed uint64) *stormPayment {
	id := fmt.Sprintf("pay-%05d", i)
	body, _ := json.Marshal(stormPaymentBody{Payment: id, Amount: 100 + i})
	return &stormPayment{id: id, key: fmt.Sprintf(`"storm-%x-%s"`, seed, id), body: string(body), seed: seed, index: i}
}

// stormPaymentOfKey is the payment id an Idempotency-Key field names.
func stormPaymentOfKey(field string) string {
	i := strings.LastIndex(field, "pay-")
	if i < 0 {
		return field
	}
	return strings.TrimSuffix(field[i:], `"`)
}

// stormResult is what one client went through.
type stormResult struct {
	final           bool // a final answer (2xx, or a 4xx other than 409 in-progress)
	status          int
	payment, charge string // of a 201
	replayed        bool
	last            string   // the last answer, for messages
	budget          string   // set when the budget ran out: how its window was derived
	odd             []string // answers that are neither final nor expected on the way

	attempts, timeouts, errors            int
	inProgress                            int
	unavailable, outcomeUnknown, other503 int
}

type stormTotals struct {
	odd                                               []string
	clients, requests, timeouts, errors, maxAttempts  int
	inProgress, unavailable, outcomeUnknown, other503 int
	fresh, replayed                                   int
}

func (t *stormTotals) add(r stormResult) {
	t.clients++
	t.odd = append(t.odd, r.odd...)
	t.requests += r.attempts
	t.maxAttempts = max(t.maxAttempts, r.attempts)
	t.timeouts += r.timeouts
	t.errors += r.errors
	t.inProgress += r.inProgress
	t.unavailable += r.unavailable
	t.outcomeUnknown += r.outcomeUnknown
	t.other503 += r.other503
	if r.status == http.StatusCreated {
		if r.replayed {
			t.replayed++
		} else {
			t.fresh++
		}
	}
}

// client is one client of payment p: a real http.Client with a transport
// of its own, sending the payment with its key until it gets a final
// answer, each request with a timeout of 50–150 ms that grows after the
// tenth attempt (stormTimeout), with a jittered, doubling, capped backoff
// (not Retry-After's whole seconds: an impatient client, to make the
// storm), at most stormMaxAttempts times and for at most its budget
// (stormBudgetOver). It reports, it does not fail the test.
func (s *storm) client(ctx context.Context, url string, p *stormPayment, c int) stormResult {
	rng := rand.New(rand.NewPCG(p.seed^0x9e3779b97f4a7c15, uint64(p.index*stormClients+c)))
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	var r stormResult
	start := time.Now()
	for r.attempts < stormMaxAttempts && ctx.Err() == nil {
		if r.budget = stormBudgetOver(s.probe, start); r.budget != "" {
			break
		}
		r.attempts++
		actx, cancel := context.WithTimeout(ctx, stormTimeout(rng, r.attempts))
		reply := wirePost(actx, hc, url, p.key, p.body)
		cancel()
		switch {
		case reply.err != nil:
			var ne net.Error
			if errors.Is(reply.err, context.DeadlineExceeded) || (errors.As(reply.err, &ne) && ne.Timeout()) {
				r.timeouts++
				r.last = "timeout"
			} else {
				r.errors++
				r.last = reply.err.Error()
				r.odd = append(r.odd, r.last)
			}
		case reply.resp.StatusCode == http.StatusConflict && stormProblemCode(reply.body) == "in-progress":
			r.inProgress++
			r.last = "409 in-progress"
		case reply.resp.StatusCode == http.StatusServiceUnavailable:
			r.last = fmt.Sprintf("503 %s", reply.body)
			switch stormProblemCode(reply.body) {
			case "store-unavailable":
				r.unavailable++
			case "outcome-unknown":
				r.outcomeUnknown++
			default:
				r.other503++
				r.odd = append(r.odd, r.last)
			}
		case reply.resp.StatusCode >= 200 && reply.resp.StatusCode < 500:
			r.final = true
			r.status = reply.resp.StatusCode
			r.replayed = reply.resp.Header.Get(idempotency.HeaderIdempotentReplayed) == "true"
			r.last = fmt.Sprintf("%d %s", r.status, reply.body)
			var receipt stormReceipt
			if json.Unmarshal(reply.body, &receipt) == nil {
				r.payment, r.charge = receipt.Payment, receipt.Charge
			}
			return r
		default: // another 5xx: not an answer; a real client retries it too
			r.errors++
			r.last = fmt.Sprintf("%d %s", reply.resp.StatusCode, reply.body)
			r.odd = append(r.odd, r.last)
		}
		backoff := min(stormBackoffFirst<<min(r.attempts-1, 8), stormBackoffMax)
		backoff = backoff/2 + time.Duration(rng.Int64N(int64(backoff/2)+1))
		if stormSleep(ctx, backoff) != nil {
			break
		}
	}
	return r
}

func stormSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func stormProblemCode(body []byte) string {
	var p problemDoc
	if json.Unmarshal(body, &p) != nil {
		return ""
	}
	return p.Code
}

// stormRecordOf reads p's record: the Middleware's record of a request is
// prefix+"h:"+Key("http", principal, method, route, key) (see WithPrefix
// and Middleware).
func stormRecordOf(ctx context.Context, c *redis.Client, p *stormPayment) stormKey {
	key, err := idempotency.ParseKey(p.key)
	if err != nil {
		return stormKey{state: err.Error()}
	}
	rec := stormKey{key: "idem:h:" + idempotency.Key("http", "", http.MethodPost, "POST /payments", key), kind: "record"}
	// State and TTL in one transaction: read apart, a record could expire
	// between them ("c" with TTL -2ns).
	var hget *redis.StringCmd
	var pttl *redis.DurationCmd
	_, _ = c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		hget = p.HGet(ctx, rec.key, "state")
		pttl = p.PTTL(ctx, rec.key)
		return nil
	})
	switch state, err := hget.Result(); {
	case errors.Is(err, redis.Nil): // gone: state ""
	case err != nil:
		rec.state = "HGET: " + err.Error()
	default:
		rec.state = state
	}
	var err2 error
	if rec.ttl, err2 = pttl.Result(); err2 != nil {
		rec.state += "; PTTL: " + err2.Error()
	}
	return rec
}

// stormKey is one key on the store.
type stormKey struct {
	key, kind string
	ttl       time.Duration // -1ns: none, -2ns: gone
	state     string        // of a record
}

func (k stormKey) String() string {
	return fmt.Sprintf("%s state %q TTL %v", k.key, k.state, k.ttl)
}

// stormScan lists the store's keys with SCAN (which, unlike DBSIZE, skips
// keys that have expired but are not yet evicted), and their TTLs.
func stormScan(t *testing.T, c *redis.Client) []stormKey {
	t.Helper()
	ctx := t.Context()
	var out []stormKey
	var cursor uint64
	for range 100_000 { // bounded: a few thousand keys at most
		keys, next, err := c.Scan(ctx, cursor, "*", 1000).Result()
		require.NoError(t, err)
		for _, k := range keys {
			sk := stormKey{key: k, kind: "other"}
			switch {
			case strings.HasPrefix(k, "idem:h:"):
				sk.kind = "record"
			case strings.HasPrefix(k, "idem:l:"):
				sk.kind = "lock"
			case strings.HasPrefix(k, redlease.ReservedPrefix+"fence:"):
				sk.kind = "fence"
			}
			ttl, err := c.PTTL(ctx, k).Result()
			require.NoError(t, err)
			if ttl == -2*time.Nanosecond { // expired between SCAN and PTTL
				continue
			}
			sk.ttl = ttl
			if sk.kind == "record" {
				sk.state, err = c.HGet(ctx, k, "state").Result()
				if errors.Is(err, redis.Nil) {
					continue
				}
				require.NoError(t, err)
			}
			out = append(out, sk)
		}
		cursor = next
		if cursor == 0 {
			return out
		}
	}
	t.Fatal("SCAN did not finish")
	return nil
}

// stormLatencies collects durations: of requests on the server side, and,
// as a go-redis hook, of the Barrier's store commands (pool wait included).
type stormLatencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *stormLatencies) add(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.d = append(l.d, d)
}

func (l *stormLatencies) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return "none"
	}
	d := slices.Clone(l.d)
	slices.Sort(d)
	q := func(f float64) time.Duration { return d[int(f*float64(len(d)-1))].Round(100 * time.Microsecond) }
	return fmt.Sprintf("%d, p50 %v p99 %v max %v", len(d), q(0.5), q(0.99), q(1))
}

func (l *stormLatencies) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *stormLatencies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		l.add(time.Since(start))
		return err
	}
}

func (l *stormLatencies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		l.add(time.Since(start))
		return err
	}
}

// fnv64 is FNV-1a, to derive a run's random draws from its payment id.
func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// stormSize is the storm's size and seed, from -storm.payments and
// -storm.seed (0: from the clock).
func stormSize(t *testing.T) (n int, seed uint64) {
	t.Helper()
	n = *stormPayments
	require.Positive(t, n, "-storm.payments")
	seed = *stormSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	return n, seed
}

// stormStore starts the storm's store, resumed at cleanup whatever fails,
// with an admin client, the Barrier's client (its commands' latencies
// recorded in cmds) and a Watchdog closed at cleanup.
func stormStore(t *testing.T) (srv *redistest.Server, admin, storeClient *redis.Client, cmds *stormLatencies, w *renew.Watchdog) {
	t.Helper()
	srv = redistest.Start(t, redistest.Config{})
	t.Cleanup(srv.Resume) // never leave the store stopped, whatever fails
	admin = srv.Client()
	storeClient = srv.Client()
	cmds = &stormLatencies{}
	storeClient.AddHook(cmds)
	w, err := renew.New()
	require.NoError(t, err)
	t.Cleanup(func() { w.Close() })
	return srv, admin, storeClient, cmds, w
}

// stormPauser stops the store (SIGSTOP) for stormPause twice: once a
// fifth and once three fifths of the storm's payments have been answered
// to all their callers (mid-storm at any size).
type stormPauser struct {
	n       int // the storm's payments
	done    atomic.Int32
	pauses  chan struct{} // buffered: a send never blocks
	runDone chan struct{}
	wg      sync.WaitGroup
}

// startStormPauser starts the pauser of srv for a storm of n payments;
// paused is told each pause's start and end, from the pauser's goroutine.
func startStormPauser(srv *redistest.Server, n int, paused func(at, end time.Time)) *stormPauser {
	p := &stormPauser{n: n, pauses: make(chan struct{}, 2), runDone: make(chan struct{})}
	p.wg.Go(func() {
		for range 2 {
			select {
			case <-p.pauses:
			case <-p.runDone: // a storm too small for two pauses
				return
			}
			at := time.Now()
			srv.Pause()
			time.Sleep(stormPause)
			srv.Resume()
			paused(at, time.Now())
		}
	})
	return p
}

// answered counts a payment answered to all its callers.
func (p *stormPauser) answered() {
	if a := int(p.done.Add(1)); a == max(p.n/5, 1) || a == max(p.n*3/5, 2) {
		p.pauses <- struct{}{} // buffered: never blocks
	}
}

// stop ends the pauser, the run being over, and waits for it.
func (p *stormPauser) stop() {
	close(p.runDone)
	p.wg.Wait()
}
