package idempotency_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
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
)

// The direct storm's shape, beside the HTTP storm's (stormClients,
// stormInFlight, stormLease, the callers' deadlines, backoff and budgets,
// stormPause are shared).
const (
	directRetention = 60 * time.Second       // past the callers' budgets on a quiet machine (a run after it is explained)
	directPreMin    = 20 * time.Millisecond  // the handler's provider call before the charge: 20–120 ms
	directPreSpan   = 100 * time.Millisecond //
	directPostMin   = 10 * time.Millisecond  // its work after the charge: 10–80 ms
	directPostSpan  = 70 * time.Millisecond  //
)

// TestStormOfRetriesThroughDoAndConsumer is the storm without HTTP: each
// payment goes through Barrier.Do (subtest Do) or Consumer.HandlePayload
// (subtest Consumer; select one with -run 'TestStormOfRetriesThrough/Do'),
// sent by three callers at once, each with a deadline of 50–150 ms,
// shorter than many handler runs, that grows after the tenth attempt
// (stormTimeout). A caller that gets no outcome (its deadline,
// ErrInProgress, a store failure, a cancelled run; for the Consumer, ack
// false) tries again — a retry, or a redelivery — until it gets one, at
// most stormMaxAttempts times and for its budget (stormBudgetOver). The
// store is paused (SIGSTOP) twice for 300 ms mid-storm. The handler calls
// its provider, charges the ledger (one charge per payment, runs under an
// older fence refused: the HTTP storm's ledger), then works on after the
// charge before it returns its receipt, which names the charge and the
// fence of the run that returned it. Size and seed: -storm.payments,
// -storm.seed.
//
// It checks, counting what each check examined: every payment charged
// exactly once; no run reached the ledger after the charge (a second
// charge, which the ledger refuses as a payments table would) unless the
// charging run's lock was lost (its handler's ctx says so, or, once the
// handler returned and its caller may have left, the keeper saw it lost
// or out of validity before the Barrier stopped keeping it: lostKeeper),
// Close cut a run short, or an outcome was not recorded; every answer a
// caller got (a Do result; for the Consumer, the record its ack stands
// on) names that charge and was returned by the run that charged, unless
// that run's outcome was explained away (its lock lost, its outcome not
// recorded, a store pause during its recording, or every later run began
// a retention after it returned); a last duplicate, once all callers were
// answered, replays that answer without running the handler; and Close
// finds no run left behind.
func TestStormOfRetriesThroughDoAndConsumer(t *testing.T) {
	for _, via := range []string{"Do", "Consumer"} {
		t.Run(via, func(t *testing.T) { directStorm(t, via) })
	}
}

// directReceipt is the handler's result: the payment's charge, and the
// fence of the run that returned it.
type directReceipt struct {
	Payment string `json:"payment"`
	Charge  string `json:"charge"`
	Fence   uint64 `json:"fence"`
}

var errSuperseded = errors.New("superseded by a newer run")

// directStormState is what the handler and the callers saw, by payment.
type directStormState struct {
	seed   uint64
	start  time.Time
	ledger *stormLedger
	probe  *redistest.StallProbe // the callers' budgets are derived from what it measures

	mu       sync.Mutex
	charged  map[string]directCharge // the run that charged, by payment
	told     map[string][]string     // runs whose ctx ended with their lock lost or Close, or whose lock was lost while kept, by payment
	runOf    map[uint64]string       // the payment of each run, by its fence (lostKeeper's lookup)
	notRec   map[string]int          // ErrNotRecorded answers, by payment
	pauses   [][2]time.Time          // the store's pauses
	runs     atomic.Int32
	unfenced atomic.Int32
}

type directCharge struct {
	fence    uint64    // set when the run charged
	returned time.Time // when the charging run returned (zero: it did not, told to stop after the charge)
}

func (s *directStormState) tell(id string, fence uint64, cause error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.told[id] = append(s.told[id], fmt.Sprintf("fence %d at %.2fs: %v", fence, time.Since(s.start).Seconds(), cause))
}

// lostKeeper keeps locks with keeper and tells s of each lock lost while
// kept (Lost closed before the Barrier stopped keeping it): a lost lock
// explains a later run, whether it was lost while the handler ran (its ctx
// says so, see handler) or after it returned, while its outcome was being
// recorded (nobody's ctx says so then: the caller may have left).
type lostKeeper struct {
	keeper redlease.Keeper
	s      *directStormState
	wg     sync.WaitGroup
}

func (k *lostKeeper) Keep(lk *redlease.Lock) (stop func()) {
	stopKeeping := k.keeper.Keep(lk)
	var stopped atomic.Bool
	done := make(chan struct{})
	var once sync.Once
	lost := func(how string) {
		once.Do(func() {
			k.s.mu.Lock()
			id, ok := k.s.runOf[lk.Fence()]
			k.s.mu.Unlock()
			if ok {
				k.s.tell(id, lk.Fence(), fmt.Errorf("%s: %v", how, lk.Err()))
			}
		})
	}
	k.wg.Go(func() {
		select {
		case <-lk.Lost():
			// The Barrier stops keeping a lock before it releases it: a
			// release after stop closes Lost too, and is not a loss.
			if !stopped.Load() {
				lost("lost while kept")
			}
		case <-done:
		}
	})
	return sync.OnceFunc(func() {
		// A lock whose validity ended while it was kept (the Barrier may
		// see Valid false, give up recording and stop keeping it before
		// the lock's own expiry closes Lost) was lost while kept too.
		if !lk.Valid() {
			lost("lost while kept (validity over at stop)")
		}
		stopped.Store(true)
		close(done)
		stopKeeping()
	})
}

// handler is payment id's handler: provider call, charge, more work,
// receipt.
func (s *directStormState) handler(id string) idempotency.Handler {
	return func(ctx context.Context, fence uint64) ([]byte, error) {
		s.runs.Add(1)
		if fence == 0 {
			s.unfenced.Add(1)
			return nil, errors.New("no fence")
		}
		context.AfterFunc(ctx, func() {
			if c := context.Cause(ctx); errors.Is(c, redlease.ErrLost) || errors.Is(c, idempotency.ErrClosed) {
				s.tell(id, fence, c)
			}
		})
		s.mu.Lock()
		s.runOf[fence] = id
		s.mu.Unlock()
		run := &stormRun{fence: fence, began: time.Now()}
		if !s.ledger.begin(id, run) {
			return nil, errSuperseded
		}
		rng := rand.New(rand.NewPCG(s.seed, fnv64(id)^fence<<48))
		// The provider call: not cancellable, as a call on its way cannot be
		// taken back.
		time.Sleep(directPreMin + time.Duration(rng.Int64N(int64(directPreSpan)+1)))
		charge, res := s.ledger.commit(id, run)
		if res == chargeStale {
			return nil, errSuperseded
		}
		if res == chargeApplied {
			s.mu.Lock()
			s.charged[id] = directCharge{fence: fence}
			s.mu.Unlock()
		}
		// Work after the charge (a receipt, a notification); it stops if
		// the run is told to.
		if err := stormSleep(ctx, directPostMin+time.Duration(rng.Int64N(int64(directPostSpan)+1))); err != nil {
			return nil, fmt.Errorf("after the charge: %w", context.Cause(ctx))
		}
		if res == chargeApplied {
			s.mu.Lock()
			s.charged[id] = directCharge{fence: fence, returned: time.Now()}
			s.mu.Unlock()
		}
		return json.Marshal(directReceipt{Payment: id, Charge: charge, Fence: fence})
	}
}

// directAnswer is what one caller went through.
type directAnswer struct {
	final       bool
	result      []byte // Do's result (nil for the Consumer)
	replayed    bool
	notRecorded bool
	last        string
	budget      string // set when the budget ran out: how its window was derived
	odd         []string
	others      []string // the first errors of no kind above

	attempts, timeouts, inProgress, cancelled, superseded, other int
	notObtained                                                  int
}

func directStorm(t *testing.T, via string) {
	wireNoLeaks(t)
	n, seed := stormSize(t)
	t.Logf("storm via %s: %d payments × %d callers, seed %d (replay the draws with -storm.seed=%d)", via, n, stormClients, seed, seed)

	srv, admin, storeClient, cmds, w := stormStore(t)
	s := &directStormState{seed: seed, ledger: &stormLedger{entries: map[string]*ledgerEntry{}}, probe: redistest.StartStallProbe(t),
		charged: map[string]directCharge{}, told: map[string][]string{}, runOf: map[uint64]string{}, notRec: map[string]int{}}
	keeper := &lostKeeper{keeper: w, s: s}
	t.Cleanup(keeper.wg.Wait) // after the Barrier's Close (cleanups run last first): every Keep stopped
	b, err := idempotency.New(storeClient,
		idempotency.WithRetention(directRetention),
		idempotency.WithLease(stormLease),
		idempotency.WithKeeper(keeper))
	require.NoError(t, err)
	consumer := newConsumer(t, b)
	ns := map[string]string{"Do": "idem:r:", "Consumer": "idem:m:"}[via]

	// call is one delivery of payment p: ok when the caller has an outcome.
	call := func(ctx context.Context, p *stormPayment, h idempotency.Handler) (out idempotency.Outcome, ok bool, err error) {
		if via == "Do" {
			out, err = b.Do(ctx, idempotency.Request{Key: p.id, Fingerprint: idempotency.PayloadHash([]byte(p.body))}, h)
			return out, err == nil || errors.Is(err, idempotency.ErrNotRecorded), err
		}
		ok, err = consumer.HandlePayload(ctx, p.id, []byte(p.body), h)
		return out, ok, err
	}
	caller := func(ctx context.Context, p *stormPayment, c int) directAnswer {
		rng := rand.New(rand.NewPCG(p.seed^0x9e3779b97f4a7c15, uint64(p.index*stormClients+c)))
		var a directAnswer
		start := time.Now()
		for a.attempts < stormMaxAttempts && ctx.Err() == nil {
			if a.budget = stormBudgetOver(s.probe, start); a.budget != "" {
				break
			}
			a.attempts++
			actx, cancel := context.WithTimeout(ctx, stormTimeout(rng, a.attempts))
			out, ok, err := call(actx, p, s.handler(p.id))
			cancel()
			switch {
			case ok:
				a.final, a.result, a.replayed = true, out.Result, out.Replayed
				a.notRecorded = errors.Is(err, idempotency.ErrNotRecorded)
				if a.notRecorded {
					s.mu.Lock()
					s.notRec[p.id]++
					s.mu.Unlock()
				}
				if err != nil && !a.notRecorded {
					a.odd = append(a.odd, "acked with "+err.Error())
				}
				a.last = fmt.Sprintf("ok (err %v)", err)
				return a
			case idempotency.Permanent(err):
				a.odd = append(a.odd, "permanent: "+err.Error())
				a.last = err.Error()
				return a
			case errors.Is(err, idempotency.ErrRunCancelled):
				a.cancelled++
			case errors.Is(err, errSuperseded):
				a.superseded++
			case errors.Is(err, idempotency.ErrInProgress):
				a.inProgress++
			case errors.Is(err, context.DeadlineExceeded):
				a.timeouts++
			case errors.Is(err, redlease.ErrNotObtained):
				// The lock was held (the request is in progress), but the
				// caller's deadline passed before the answer came back: run
				// answers the lock's own error, not ErrInProgress.
				a.notObtained++
			default: // the store paused, a takeover: not an outcome, try again
				a.other++
				if len(a.others) < 2 {
					a.others = append(a.others, err.Error())
				}
			}
			a.last = fmt.Sprint(err)
			backoff := min(stormBackoffFirst<<min(a.attempts-1, 8), stormBackoffMax)
			backoff = backoff/2 + time.Duration(rng.Int64N(int64(backoff/2)+1))
			if stormSleep(ctx, backoff) != nil {
				break
			}
		}
		return a
	}

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute+time.Duration(n)*100*time.Millisecond)
	defer cancel()
	payments := make([]*stormPayment, n)
	answers := make([][stormClients]directAnswer, n)
	records := make([]directRecord, n)
	lasts := make([]directLast, n)
	sem := make(chan struct{}, stormInFlight)
	var callers sync.WaitGroup
	s.start = time.Now()
	pauser := startStormPauser(srv, n, func(at, end time.Time) {
		s.mu.Lock()
		s.pauses = append(s.pauses, [2]time.Time{at, end})
		s.mu.Unlock()
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
		for c := range stormClients {
			callers.Go(func() {
				answers[i][c] = caller(ctx, p, c)
				if pending.Add(-1) == 0 {
					// All its callers answered: its record, then a last
					// duplicate, which must replay without running.
					records[i] = directRecordOf(ctx, admin, ns+p.id)
					lasts[i] = directLastCall(ctx, p, call)
					pauser.answered()
					<-sem
				}
			})
		}
	}
	callers.Wait()
	pauser.stop()
	runTime := time.Since(s.start)
	cctx, ccancel := context.WithTimeout(ctx, 2*stormLease)
	assert.NoError(t, b.Close(cctx), "Close: runs left behind")
	ccancel()
	keeper.wg.Wait() // Close ended every run, and each stopped keeping its lock

	// The checks, each counting what it examined.
	var (
		examinedPayments, examinedAnswers, examinedRecords, examinedLasts int
		fresh, replayed, notRecorded, otherRun, explained                 int
		examinedRefusals, explainedRefusals                               int
		tot                                                               directAnswer
		odd, others                                                       []string
	)
	s.mu.Lock()
	pauseSpans := slices.Clone(s.pauses)
	s.mu.Unlock()
	for i, p := range payments {
		e := s.ledger.entry(p.id)
		if !assert.NotNil(t, e, "%s: never reached the ledger", p.id) {
			continue
		}
		examinedPayments++
		assert.Equal(t, 1, e.applied, "%s: charges applied (ledger: %+v)", p.id, *e)
		s.mu.Lock()
		ch, told, nr := s.charged[p.id], slices.Clone(s.told[p.id]), s.notRec[p.id]
		s.mu.Unlock()
		// Why an answer might come from a later run than the charging one:
		// the charging run lost its lock (or was closed), its outcome was
		// not recorded, or the store was paused while it was recorded.
		why := ""
		switch {
		case ch.fence != 0 && slices.ContainsFunc(told, func(e string) bool { return strings.HasPrefix(e, fmt.Sprintf("fence %d ", ch.fence)) }):
			why = "the charging run's lock was lost or closed: " + strings.Join(told, "; ")
		case nr > 0:
			why = fmt.Sprintf("%d answers ErrNotRecorded", nr)
		case !ch.returned.IsZero() && slices.ContainsFunc(pauseSpans, func(ps [2]time.Time) bool {
			return ps[1].After(ch.returned) && ps[0].Before(ch.returned.Add(stormLease))
		}):
			why = "the store was paused within a lease of the charging run's return"
		case ch.fence != 0 && len(e.refused) > 0 && !slices.ContainsFunc(e.refused, func(r stormRun) bool {
			return r.began.Sub(e.appliedAt) < directRetention
		}):
			why = "every later run began a retention or more after the charge: the record may have gone"
		}
		// A run that reached the ledger after the charge (refused there, as a
		// payments table refuses a second charge) is a second charge the
		// Barrier let through: only a lost lock, Close or an unrecorded
		// outcome may explain one.
		if refused := len(e.refused); refused > 0 {
			examinedRefusals += refused
			if assert.NotEmpty(t, why, "%s: %d second charges the ledger refused, and nothing explains them (ledger: %+v)", p.id, refused, *e) {
				explainedRefusals += refused
			}
		}
		// checkReceipt checks one answer's result: the payment's charge, from
		// the charging run (or a later run, explained).
		checkReceipt := func(what string, result []byte) {
			var r directReceipt
			if !assert.NoError(t, json.Unmarshal(result, &r), "%s: %s: result %q", p.id, what, result) {
				return
			}
			assert.Equal(t, p.id, r.Payment, "%s: %s: another payment's receipt", p.id, what)
			assert.Equal(t, e.charge, r.Charge, "%s: %s: not the payment's charge", p.id, what)
			if r.Fence != ch.fence {
				otherRun++
				if assert.NotEmpty(t, why, "%s: %s: returned by the run with fence %d, not by the charging run (fence %d), and nothing explains it", p.id, what, r.Fence, ch.fence) {
					explained++
				}
			}
		}
		for c, a := range answers[i] {
			tot.attempts += a.attempts
			tot.timeouts += a.timeouts
			tot.inProgress += a.inProgress
			tot.cancelled += a.cancelled
			tot.superseded += a.superseded
			tot.other += a.other
			tot.notObtained += a.notObtained
			odd = append(odd, a.odd...)
			others = append(others, a.others...)
			if !assert.True(t, a.final, "%s caller %d: no outcome after %d attempts: %s (budget: %s)", p.id, c, a.attempts, a.last, a.budget) {
				continue
			}
			switch {
			case a.notRecorded:
				notRecorded++
			case a.replayed:
				replayed++
			default:
				fresh++
			}
			if via == "Do" {
				examinedAnswers++
				checkReceipt(fmt.Sprintf("caller %d's answer", c), a.result)
			}
		}
		// The record the answers stand on, read once all were answered.
		rec := records[i]
		switch {
		case rec.state == "c":
			examinedRecords++
			if assert.Equal(t, "ok", rec.kind, "%s: record %s", p.id, rec) {
				checkReceipt("the record", rec.result)
			}
			assert.True(t, rec.ttl > 0 && rec.ttl <= directRetention, "%s: record %s: TTL", p.id, rec)
		case rec.state == "p" && nr > 0:
			// Answered by a run that could not record: in progress until a
			// retry takes it over.
		default:
			assert.Fail(t, "a payment answered, its record not completed", "%s: %s (ErrNotRecorded answers %d)", p.id, rec, nr)
		}
		// The last duplicate.
		l := lasts[i]
		if rec.state == "c" {
			examinedLasts++
			assert.NoError(t, l.err, "%s: the last duplicate", p.id)
			assert.True(t, l.ok, "%s: the last duplicate has no outcome (%v)", p.id, l.err)
			assert.Zero(t, l.ran, "%s: the last duplicate ran the handler", p.id)
			if via == "Do" {
				assert.True(t, l.out.Replayed, "%s: the last duplicate is not a replay", p.id)
				assert.Equal(t, string(rec.result), string(l.out.Result), "%s: the last duplicate's answer is not the record's", p.id)
			}
		}
	}
	assert.Empty(t, odd, "answers no caller should get")
	assert.Zero(t, s.unfenced.Load(), "handler runs without a fence")
	led := s.ledger.totals()
	assert.Equal(t, n, led.applied, "charges applied: one per payment")
	assert.Equal(t, led.runs, led.applied+led.dups+led.stale, "every run that reached the ledger charged or was refused")
	// Every check examined something.
	assert.Equal(t, n, examinedPayments, "payments whose charges were counted")
	assert.Positive(t, examinedRecords, "completed records compared with the charge")
	assert.Positive(t, examinedLasts, "last duplicates that had to replay")
	if via == "Do" {
		assert.Positive(t, examinedAnswers, "callers' answers compared with the charge")
	}
	assert.Positive(t, tot.timeouts, "callers whose deadline ended (the storm's point)")
	if via == "Do" {
		assert.Positive(t, replayed, "answers replayed")
	}

	s.mu.Lock()
	toldN, keptLost, overAtStop := 0, 0, 0
	for _, l := range s.told {
		toldN += len(l)
		for _, e := range l {
			if strings.Contains(e, "lost while kept") {
				keptLost++
			}
			if strings.Contains(e, "validity over at stop") {
				overAtStop++
			}
		}
	}
	pauseLog := make([]string, 0, len(s.pauses))
	for _, ps := range s.pauses {
		pauseLog = append(pauseLog, fmt.Sprintf("%.2fs", ps[0].Sub(s.start).Seconds()))
	}
	s.mu.Unlock()
	ps := storeClient.PoolStats()
	t.Logf("storm via %s: run %.2fs (pauses at %s), wall %.2fs", via, runTime.Seconds(), strings.Join(pauseLog, ", "), time.Since(s.start).Seconds())
	t.Logf("storm via %s: callers %d, attempts %d, deadlines %d, in progress %d, run cancelled %d, superseded %d, lock not obtained %d, other errors %d; outcomes fresh %d, replayed %d, not recorded %d (the Consumer's acks count as fresh: an ack does not say)",
		via, n*stormClients, tot.attempts, tot.timeouts, tot.inProgress, tot.cancelled, tot.superseded, tot.notObtained, tot.other, fresh, replayed, notRecorded)
	t.Logf("storm via %s: handler runs %d (ledger: %d, charges applied %d, second charges refused %d: duplicate %d, stale fence %d); runs told lock lost/closed %d (%d of them lost while kept, seen by the keeper, %d of those with validity over when the Barrier stopped keeping); refused runs explained %d of %d",
		via, s.runs.Load(), led.runs, led.applied, led.dups+led.stale, led.dups, led.stale, toldN, keptLost, overAtStop, explainedRefusals, examinedRefusals)
	t.Logf("storm via %s: examined payments %d, answers %d, records %d, last duplicates %d; answers from a later run than the charging one %d (explained %d)",
		via, examinedPayments, examinedAnswers, examinedRecords, examinedLasts, otherRun, explained)
	t.Logf("storm via %s: store commands %s; pool waits %d (%v), pool timeouts %d",
		via, cmds, ps.WaitCount, time.Duration(ps.WaitDurationNs).Round(time.Millisecond), ps.Timeouts)
	for i, o := range odd {
		if i == 10 {
			break
		}
		t.Logf("storm via %s: odd: %s", via, o)
	}
	for i, o := range others {
		if i == 5 {
			break
		}
		t.Logf("storm via %s: other error: %s", via, o)
	}
}

// directLast is the last duplicate of a payment, sent once all its callers
// were answered.
type directLast struct {
	out idempotency.Outcome
	ok  bool
	err error
	ran int32
}

func directLastCall(ctx context.Context, p *stormPayment, call func(context.Context, *stormPayment, idempotency.Handler) (idempotency.Outcome, bool, error)) directLast {
	var l directLast
	var ran atomic.Int32
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	l.out, l.ok, l.err = call(lctx, p, func(context.Context, uint64) ([]byte, error) {
		ran.Add(1)
		return nil, errors.New("the last duplicate must not run")
	})
	l.ran = ran.Load()
	return l
}

// directRecord is a record's state, kind, result and TTL, read in one
// transaction.
type directRecord struct {
	key, state, kind string
	result           []byte
	ttl              time.Duration
}

func (r directRecord) String() string {
	return fmt.Sprintf("%s state %q kind %q result %q TTL %v", r.key, r.state, r.kind, r.result, r.ttl)
}

func directRecordOf(ctx context.Context, c *redis.Client, key string) directRecord {
	rec := directRecord{key: key}
	var hm *redis.SliceCmd
	var pttl *redis.DurationCmd
	_, err := c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		hm = p.HMGet(ctx, key, "state", "kind", "result")
		pttl = p.PTTL(ctx, key)
		return nil
	})
	if err != nil {
		rec.state = "read: " + err.Error()
		return rec
	}
	v := hm.Val()
	str := func(i int) string {
		s, _ := v[i].(string)
		return s
	}
	rec.state, rec.kind, rec.result = str(0), str(1), []byte(str(2))
	rec.ttl = pttl.Val()
	return rec
}
