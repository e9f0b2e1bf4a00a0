package redlease

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	jittered "github.com/redlease/redlease/internal/backoff"
	"github.com/redlease/redlease/internal/fused"
	"github.com/redlease/redlease/internal/locktoken"
)

// Locker hands out locks on one default Strategy (replaceable per call with
// WithStrategy). It holds no connections and starts no goroutines of its
// own but one: a fair-mode Lock with a ctx deadline that gives up leaves
// the key's line in the background, for at most 250 ms (Do uses the
// process-wide default watchdog unless given WithKeeper or WithoutKeeper);
// it is safe for concurrent use and meant to be shared by a whole process.
type Locker struct {
	defaults lockConfig
	prefix   string
	keeper   Keeper
	observer Observer
	clock    Clock
}

// New returns a Locker that takes locks through s with the given options.
// A nil s, a rejected option, or options that contradict each other (a
// loss margin not shorter than the TTL) are returned as an error that
// errors.Is ErrInvalid. Options given to one call are checked by that
// call.
func New(s Strategy, opts ...Option) (*Locker, error) {
	if isNil(s) {
		return nil, Invalid("nil Strategy")
	}
	l := &Locker{clock: systemClock{}, defaults: lockConfig{
		strategy:    s,
		ttl:         DefaultTTL,
		minDelay:    DefaultMinRetryDelay,
		maxDelay:    DefaultMaxRetryDelay,
		outageLimit: DefaultOutageLimit,
	}}
	for _, o := range opts {
		if o != nil {
			o.applyLocker(l)
		}
	}
	if l.defaults.err != nil {
		return nil, l.defaults.err
	}
	if m := l.defaults.lossMargin(); m >= l.defaults.ttl {
		return nil, Invalid("loss margin %v: must be shorter than the ttl %v", m, l.defaults.ttl)
	}
	return l, nil
}

// isNil reports whether s is nil, including a nil pointer in the interface:
// the result of a strategy constructor whose error was ignored.
func isNil(s Strategy) bool {
	if s == nil {
		return true
	}
	v := reflect.ValueOf(s)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

func (l *Locker) config(key string, opts []LockOption) (lockConfig, error) {
	if l == nil {
		return lockConfig{}, Invalid("nil Locker")
	}
	c := l.defaults
	if len(opts) > 0 {
		oc := new(lockConfig) // options take a pointer; keep the common no-option call free of it
		*oc = c
		for _, o := range opts {
			if o != nil {
				o.applyLock(oc)
			}
		}
		c = *oc
	}
	if c.err != nil {
		return c, c.err
	}
	if key == "" {
		return c, Invalid("empty key")
	}
	if m := c.lossMargin(); m >= c.ttl {
		return c, Invalid("loss margin %v: must be shorter than the ttl %v", m, c.ttl)
	}
	return c, nil
}

// TryLock makes one attempt to take key. It returns ErrNotObtained (possibly
// with per-node causes) if the key is held, ErrUnavailable if too few nodes
// answered (an outage, not a holder), ErrDenied if the nodes refused the
// client's credentials or rights, and never waits for a holder to let go.
func (l *Locker) TryLock(ctx context.Context, key string, opts ...LockOption) (*Lock, error) {
	c, err := l.config(key, opts)
	if err != nil {
		return nil, err
	}
	return l.try(ctx, c, key)
}

// try is TryLock with the call's config made.
func (l *Locker) try(ctx context.Context, c lockConfig, key string) (*Lock, error) {
	token := locktoken.New(ctx, l.prefix+key)
	var place *Place
	if c.fair {
		if _, ok := c.strategy.(Queuer); ok {
			// It respects the line, and never joins: it would not come
			// back for its turn.
			place = &Place{ID: token, Ticket: time.Now()}
		}
	}
	return l.attempt(ctx, c, key, token, place)
}

// Lock takes key, retrying with jittered exponential backoff (WithRetryDelay)
// until it is obtained, ctx is done, or WithMaxAttempts attempts are spent.
// It retries refusals (ErrNotObtained) and outages (ErrUnavailable), and
// returns any other error at once (ErrDenied, ErrInvalid): retrying would
// not change it. When ctx ends the wait, the error errors.Is ctx's error,
// and ErrNotObtained if the nodes' last answer was "held" (or no attempt
// was answered), ErrUnavailable if it was an outage.
//
// On a Strategy that is a Waker (single, quorum, failover), the first
// attempt the nodes refused is followed by a subscription to the key's
// releases, confirmed by the nodes, and then at once by another attempt:
// a release after that check is heard, and ends the wait. Each wait after a refusal
// ends at the first of: a release notice, the backoff, the holder's
// remaining TTL (+1 ms), ctx. The subscription ends when Lock returns.
//
// Every attempt has its own token, "<base>.<n>" (see Strategy). A failed
// attempt's cleanup (the quorum strategy's undo on every node that answered
// late, the one-primary strategies' release of a grant that was not
// acknowledged or whose reply was lost) compares the token, so it can only
// remove that attempt's own writes, never a key that a later attempt
// counted, however late it lands. A later attempt takes over a key an
// earlier one of the same call left behind, so a lost reply costs one
// retry, not the TTL.
//
// Without a ctx deadline and WithMaxAttempts, Lock waits as long as the key
// stays taken, like sync.Mutex. An outage is not a held key: when no node
// decided its attempts (each failed with ErrUnavailable) for the outage
// limit (WithOutageLimit; DefaultOutageLimit, 10 s), Lock gives up with an
// error that errors.Is ErrUnavailable, not ErrNotObtained: nobody refused.
func (l *Locker) Lock(ctx context.Context, key string, opts ...LockOption) (*Lock, error) {
	c, err := l.config(key, opts)
	if err != nil {
		return nil, err
	}
	return l.wait(ctx, c, key)
}

// wait is Lock with the call's config made: the retry loop, observed as
// a "wait".
func (l *Locker) wait(ctx context.Context, c lockConfig, key string) (*Lock, error) {
	ctx, done := observe(ctx, l.observer, Op{Name: "wait", Strategy: strategyName(c.strategy), Key: key})
	lk, err := l.retry(ctx, c, key)
	done(err)
	return lk, err
}

// fullDelay is an attempt number whose backoff is drawn at the max retry
// delay, whatever the min (the doubling stops there).
const fullDelay = 64

// leaveBound bounds the LeaveLine of a Lock that gives up.
const leaveBound = 250 * time.Millisecond

// retry is Lock's loop: attempt, and while the nodes refuse (or none
// decides), wait and attempt again. What it carries from one attempt to
// the next: the wait (a wake subscription, see waiting), the outage
// accounting (see outage), the last refusal and the run of queued ones.
func (l *Locker) retry(ctx context.Context, c lockConfig, key string) (lk *Lock, err error) {
	base := locktoken.New(ctx, l.prefix+key)
	jitter := jittered.NewStream(ctx, 0)
	var (
		w         waiting
		out       = outage{limit: c.outageLimit}
		refused   error // the last attempt the nodes decided: "held"
		queuedRun int   // refusals in a row with ErrQueued and no holder's TTL
		place     *Place
	)
	id := "" // the id Waker.Watch knows this call by: its id in the line in fair mode
	if q, ok := c.strategy.(Queuer); ok && c.fair {
		// Fair mode: every attempt joins (or refreshes) this call's entry
		// in the key's line, at the ticket of its arrival.
		place = &Place{ID: base, Ticket: time.Now(), Join: true, Lifetime: LineLifetime(c.maxDelay)}
		id = base
		defer func() {
			if lk == nil {
				l.leaveLine(ctx, q, key, base, err)
			}
		}()
	}
	defer func() { w.end(lk == nil) }()
	w.listen(ctx, c, l.prefix+key, id)
	for attempt := 1; ; attempt++ {
		w.takeNotice()
		if attempt > 1 && ctx.Err() != nil {
			// The wait ended before this attempt went out (in the
			// subscription after the first): the last answer stands,
			// held or unavailable.
			return nil, withCause(err, context.Cause(ctx))
		}
		actx, cancelAttempt := out.bound(ctx)
		began := time.Now()
		lk, err = l.attempt(actx, c, key, attemptToken(base, attempt), place)
		// down: no node decided this attempt (they failed, or the outage
		// limit cut it off), and the caller's ctx did not end it.
		down := ctx.Err() == nil && err != nil && (errors.Is(err, ErrUnavailable) || actx.Err() != nil)
		cancelAttempt()
		if out.over(began, down, err) {
			return nil, outageError(err, out.lastDown, c.outageLimit)
		}
		if err == nil || (ctx.Err() == nil && !down) {
			// Answered: granted, refused, or a bad call. An attempt the
			// caller's deadline cut short (or never let out) answers
			// nothing, even if a node refused it on the way.
			w.answered()
		}
		if err == nil || !(errors.Is(err, ErrNotObtained) || errors.Is(err, ErrUnavailable)) {
			// Granted, or an answer no retry changes (ErrDenied,
			// ErrInvalid).
			return lk, err
		}
		if place != nil {
			// An attempt that too few nodes answered may come from a
			// waiter cut off from most of them: its next attempt does not
			// refresh its entries, so that they expire where it still
			// reaches, rather than hold a minority of the nodes for as
			// long as it waits.
			place.Join = !errors.Is(err, ErrUnavailable)
		}
		if ctx.Err() != nil {
			if refused != nil && errors.Is(err, ErrUnavailable) {
				// The wait ended while this attempt was on its way: its
				// "unavailable" is the caller's deadline, not a node's
				// failure. The nodes' last answer stands: held.
				err = refused
			}
			return nil, withCause(err, context.Cause(ctx))
		}
		if !errors.Is(err, ErrUnavailable) {
			refused = err
		}
		if c.maxAttempts > 0 && attempt >= c.maxAttempts {
			return nil, err
		}
		if !down && w.watch(ctx, c, l.prefix+key, id) {
			continue
		}
		n := backoffStep(attempt, w.subscribed(), err, &queuedRun)
		if !w.sleep(ctx, out.cap(boundedBackoff(jitter, n, c.minDelay, c.maxDelay, err))) {
			return nil, withCause(err, context.Cause(ctx))
		}
	}
}

// leaveLine is a fair-mode Lock giving up (with err): it leaves the key's
// line, by this call's id only, so that a dead entry does not hold the
// next waiter back for its lifetime. Best effort, bounded by leaveBound;
// in the background when the caller has a deadline, which it must not
// hold the caller past, or the nodes failed.
func (l *Locker) leaveLine(ctx context.Context, q Queuer, key, id string, err error) {
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaveBound)
	leave := func() {
		_ = q.LeaveLine(lctx, l.prefix+key, id)
		cancel()
	}
	if cleanupInBackground(ctx) || errors.Is(err, ErrUnavailable) {
		go leave()
	} else {
		leave()
	}
}

// backoffStep is the attempt number (see backoff) the wait after attempt,
// refused with err, is drawn at; subscribed: a wake subscription is on;
// queuedRun counts the refusals in a row with ErrQueued and no holder's
// TTL, this one included.
func backoffStep(attempt int, subscribed bool, err error, queuedRun *int) int {
	n := attempt
	if subscribed && !errors.Is(err, ErrUnavailable) {
		// Subscribed, and refused: a release wakes this call (or the
		// process's longest-waiting waiter, who hands the notice on
		// if it leaves), so the wait only covers a lost notice or a
		// holder that never releases, whose remaining TTL cuts it.
		// The ramp from the min delay would only add refused
		// attempts on a hot key's nodes.
		n = fullDelay
	}
	if _, held := holderRemaining(err); !held && errors.Is(err, ErrQueued) {
		// Fair mode, refused with the key free: another waiter is
		// the line's head, and no holder's TTL bounds the wait. The
		// head takes the key within a round trip or two (then the
		// next refusal carries its TTL), or it is gone and its entry
		// ends with its lifetime. Waiting the max delay would sleep
		// through the head's whole hold if its release's notice is
		// lost, so the wait ramps from the min delay, over this
		// run of such refusals.
		*queuedRun++
		n = *queuedRun
	} else {
		*queuedRun = 0
	}
	return n
}

// waiting is a Lock call's wait between attempts: its timer and its
// subscription to the key's releases (see Waker).
type waiting struct {
	timer   *time.Timer
	notices <-chan struct{} // nil: not subscribed, never ready
	// owed: this call took a notice that no attempt the nodes decided
	// has answered yet. A notice wakes one waiter of the process; one
	// that leaves owing it hands it on (see Waker).
	owed      bool
	stopWatch func(handOn bool) // ends the subscription, once there is one
	tried     bool              // Waker.Watch was called
}

// listen joins the subscription the process already has to key's
// releases, if the strategy is a Waker and c does not poll: a hot key's
// waiter then subscribes before its first check, which then is the check
// after subscribing (see Waker.Listen).
func (w *waiting) listen(ctx context.Context, c lockConfig, key, id string) {
	if wk, ok := c.strategy.(Waker); ok && !c.polling {
		if ch, stop, ok := wk.Listen(ctx, key, id); ok {
			w.notices, w.stopWatch = ch, stop
		}
	}
}

// takeNotice takes a notice that came before the attempt about to be
// sent: that attempt answers it, and only one that comes after may end
// the next wait.
func (w *waiting) takeNotice() {
	select {
	case <-w.notices:
		w.owed = true
	default:
	}
}

// answered records that an attempt the nodes decided answered the
// notices this call took: it owes none.
func (w *waiting) answered() { w.owed = false }

// subscribed reports whether releases of the key wake this call.
func (w *waiting) subscribed() bool { return w.notices != nil }

// watch subscribes to key's releases, confirmed, after the first refusal
// the nodes decided (a subscription to nodes that did not answer would
// wait for them too), once per call, and reports whether it did: the
// caller then checks again at once, since a release between the first
// check and the subscription was not heard, and one after the second
// check will be.
func (w *waiting) watch(ctx context.Context, c lockConfig, key, id string) bool {
	if w.notices != nil || w.tried || c.polling {
		return false
	}
	w.tried = true
	wk, ok := c.strategy.(Waker)
	if !ok {
		return false
	}
	ch, stop, err := wk.Watch(ctx, key, id)
	if err != nil {
		return false
	}
	w.notices, w.stopWatch = ch, stop
	return true
}

// sleep waits d, or until a notice comes (which this call then owes),
// and reports false if ctx ended first.
func (w *waiting) sleep(ctx context.Context, d time.Duration) bool {
	if w.timer == nil {
		w.timer = time.NewTimer(d)
	} else {
		w.timer.Reset(d)
	}
	select {
	case <-ctx.Done():
		return false
	case <-w.timer.C:
	case <-w.notices:
		w.owed = true
	}
	return true
}

// end stops the timer and ends the subscription; a call that gave up
// hands on a notice it owes. A notice still waiting in notices came after
// the last attempt, which did not answer it: a call that gave up hands it
// on, and a granted call drops it. Such a notice came while the granted
// attempt was on its way (on a quorum, another node's push of the release
// that freed the key for this call), and nobody else can take the key
// before this call's release, which wakes the next waiter: handed on, it
// would wake a waiter only to be refused. One that comes between this
// look and stop is still handed on by the Waker (a needless wake, never a
// lost one).
func (w *waiting) end(gaveUp bool) {
	if w.timer != nil {
		w.timer.Stop()
	}
	if w.stopWatch == nil {
		return
	}
	if !gaveUp {
		select {
		case <-w.notices:
		default:
		}
	}
	w.stopWatch(gaveUp && (w.owed || len(w.notices) > 0))
}

// outage is a Lock call's accounting of its runs of attempts that no node
// decided (see WithOutageLimit).
type outage struct {
	limit    time.Duration
	began    time.Time // when the current run began (zero: none)
	lastDown error     // the last attempt's error that no node decided (ErrUnavailable)
}

// bound is the ctx of the next attempt: in an outage, no attempt runs past
// the outage limit.
func (o *outage) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if o.began.IsZero() {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, o.began.Add(o.limit))
}

// over records an attempt that began at began, with err, down if no node
// decided it, and reports whether the outage has lasted the limit: the
// call gives up.
func (o *outage) over(began time.Time, down bool, err error) bool {
	if down && errors.Is(err, ErrUnavailable) {
		o.lastDown = err
	}
	switch {
	case !down:
		o.began = time.Time{}
	case o.began.IsZero():
		o.began = began
	}
	return down && time.Since(o.began) >= o.limit
}

// cap cuts a wait in an outage at the limit: the attempt after it is cut
// off at the outage limit anyway, and one that would start past it is
// not made.
func (o *outage) cap(wait time.Duration) time.Duration {
	if o.began.IsZero() {
		return wait
	}
	return max(min(wait, time.Until(o.began.Add(o.limit))), 0)
}

// outageError is the error of a Lock that gave up at its outage limit d,
// err being its last attempt's and lastDown the last that no node
// decided: it errors.Is ErrUnavailable, never ErrNotObtained (nobody
// refused).
func outageError(err, lastDown error, d time.Duration) error {
	if !errors.Is(err, ErrUnavailable) {
		// The outage limit cut this attempt short: it answered nothing
		// (and is no refusal); the last attempt no node decided says why.
		err = lastDown
	}
	if err == nil {
		err = ErrUnavailable
	}
	return fmt.Errorf("%w (no node decided an attempt for the outage limit, %v)", err, d)
}

// attempt makes one attempt under token, which no other attempt uses; in
// fair mode (place not nil, the strategy a Queuer) from place in the line.
func (l *Locker) attempt(ctx context.Context, c lockConfig, key, token string, place *Place) (*Lock, error) {
	if err := ctx.Err(); err != nil {
		return nil, Wrap(ErrNotObtained, context.Cause(ctx))
	}
	full := l.prefix + key
	// A Revoker tracks the grant from before the request is sent: a
	// revocation (a failover) that happens while the grant's reply is on
	// its way must still reach it.
	var tr *tracking
	if r, ok := c.strategy.(Revoker); ok {
		tr = &tracking{}
		tr.untrack = r.Track(full, token, tr.revoke)
	}
	actx, done := observe(ctx, l.observer, Op{Name: "acquire", Strategy: strategyName(c.strategy), Key: key})
	var (
		g   Grant
		err error
	)
	switch {
	case c.fused != nil:
		g, err = acquireFused(actx, c.strategy, full, token, c.ttl, c.fused)
	case place != nil:
		g, err = c.strategy.(Queuer).AcquireInLine(actx, full, token, c.ttl, *place)
	default:
		g, err = c.strategy.Acquire(actx, full, token, c.ttl)
	}
	done(err)
	if err != nil {
		if tr != nil {
			tr.untrack()
		}
		return nil, err
	}
	lk := newLock(c.strategy, key, full, token, c.ttl, c.lossMargin(), g)
	lk.observer, lk.granted, lk.clock = l.observer, time.Now(), l.clock
	if tr != nil {
		tr.attach(lk)
	}
	if !lk.Valid() {
		// The grant came back with less validity than the loss margin (a
		// slow reply, a revocation on its way): the lock is born lost, and
		// work started under it could outlive it. It goes back (by this
		// attempt's token; the key expires within the margin anyway) and
		// counts as not obtained, so Lock tries again and Do never starts
		// fn with it; a fused script's other writes are undone after it.
		// The release waits at most the margin, and never past the
		// caller's deadline.
		cause := lk.Err()
		rctx, cancel := bornLostBound(ctx, c)
		_ = lk.Release(rctx)
		if c.fused != nil {
			c.fused.Undo(rctx, full, token) // what its script wrote beside the key
		}
		cancel()
		return nil, Wrap(ErrNotObtained, cause)
	}
	return lk, nil
}

// bornLostBound is the context of the release of a grant born lost (see
// attempt): at most the loss margin, and never past the caller's
// deadline, whatever its cancellation says.
func bornLostBound(ctx context.Context, c lockConfig) (context.Context, context.CancelFunc) {
	end := time.Now().Add(c.lossMargin())
	if dl, ok := ctx.Deadline(); ok && dl.Before(end) {
		end = dl
	}
	return context.WithDeadline(context.WithoutCancel(ctx), end)
}

// acquireFused is Acquire running f on s (see internal/fused).
func acquireFused(ctx context.Context, s Strategy, key, token string, ttl time.Duration, f fused.Script) (Grant, error) {
	fa, ok := s.(fused.Acquirer[Grant])
	if !ok {
		return Grant{}, Invalid("strategy %T runs no fused acquisition", s)
	}
	return fa.AcquireFused(ctx, key, token, ttl, f)
}

// tracking connects a Revoker's revocation to a Lock that may not exist
// yet: a revocation that arrives before the grant is held back and applied
// the moment the Lock is made.
type tracking struct {
	mu      sync.Mutex
	lk      *Lock
	cause   error // a revocation that came before the Lock
	untrack func()
}

func (t *tracking) revoke(cause error) {
	t.mu.Lock()
	lk := t.lk
	if lk == nil && t.cause == nil {
		t.cause = cause
	}
	t.mu.Unlock()
	if lk != nil {
		lk.markLost(cause)
	}
}

// attach hands the tracking over to lk: from now on a revocation marks it
// lost, and one that already came does so at once. untrack runs once lk is
// released or lost.
func (t *tracking) attach(lk *Lock) {
	lk.mu.Lock()
	lk.untrack = t.untrack
	lk.unlockMu()
	t.mu.Lock()
	t.lk = lk
	cause := t.cause
	t.mu.Unlock()
	if cause != nil {
		lk.markLost(cause)
	}
}

// boundedBackoff is backoff, cut short when the refusal said when the
// holder's key expires: the next attempt then goes 1 ms after that (the
// node measured the TTL before its reply travelled, so the key is gone by
// the time the attempt lands, unless it was extended or taken again).
// Waiting longer than the key lives would only leave it free; a wait is
// still at least 1 ms.
func boundedBackoff(s *jittered.Stream, n int, minDelay, maxDelay time.Duration, refusal error) time.Duration {
	d := backoff(s, n, minDelay, maxDelay)
	if left, ok := holderRemaining(refusal); ok {
		d = min(d, left+time.Millisecond)
	}
	return d
}

// backoff returns the wait before the attempt after attempt n (n >= 1):
// d = min(minDelay * 2^(n-1), maxDelay), drawn uniformly from [d/2, d] by
// s (the Lock call's jitter: math/rand/v2's global source unless a
// simulation seeded the call's context).
func backoff(s *jittered.Stream, n int, minDelay, maxDelay time.Duration) time.Duration {
	return jittered.Jittered(s, n, minDelay, maxDelay)
}

// attemptToken is the token of attempt n of a Lock call (see Strategy):
// one allocation.
func attemptToken(base string, n int) string {
	var b [22 + 1 + 20]byte
	return string(strconv.AppendInt(append(append(b[:0], base...), '.'), int64(n), 10))
}

// withCause adds cause to err on the same line, unless err already says it
// (an attempt cut short by the same context names it already).
func withCause(err, cause error) error {
	if cause == nil || errors.Is(err, cause) {
		return err
	}
	return Wrap(err, cause)
}

// Do takes key (with the Locker's retry policy, like Lock), keeps it alive
// while fn runs, and releases it only after fn has returned, so that
// whatever fn committed is visible before anyone else can take the key.
//
// The lock is kept alive by the Locker's Keeper (WithKeeper) or, by
// default, by the one process-wide default watchdog: it extends the lock
// on a renewal interval of a third of its TTL, like a renew.Watchdog with
// default options (see package renew for the schedule), and
// costs one goroutine plus at most two per strategy however many Do calls
// run at once. It starts with the first Do and ends its goroutines
// whenever no Do is running (after a renewal call still in flight
// returns), so a program or test that waits for its Do calls leaves none
// behind. WithoutKeeper turns renewal off: fn must then finish within the
// lock's first TTL, less the loss margin.
//
// fn's ctx is cancelled, with the lock's error as its cause, as soon as the
// lock is known lost (a renewal found it not held, or none succeeded
// before the loss margin); fn should stop and not commit then. Do waits
// for that with a timer and a context callback, not a goroutine of its
// own: a Do call in fn costs no goroutine beyond its caller's. Do returns
// fn's error; if the lock was lost before fn returned, the error also
// errors.Is ErrLost, even if fn returned nil. Failing to obtain the lock
// returns the error of Lock and does not call fn.
//
// The release after fn waits at most the strategy's call bound
// (CallBounder; DefaultCallBound, 1 s, for a strategy that states none),
// or the lock's TTL if that is shorter: a node that stops answering as fn
// returns holds Do at most as long as any other call of the strategy. A failed
// release (a node down, say) is not reported: fn's work was done under a
// valid lock, and the key expires at its TTL. A panic in fn stops the
// renewal, releases the lock and is then re-raised.
//
// The default watchdog runs on the real clock. Inside a testing/synctest
// bubble, give Do WithoutKeeper or a Keeper made in the bubble
// (WithKeeper(renew.New())): the default's goroutines and channels belong
// to whichever bubble, or none, started them.
func (l *Locker) Do(ctx context.Context, key string, fn func(ctx context.Context, lk *Lock) error, opts ...LockOption) (err error) {
	if fn == nil {
		return Invalid("nil function")
	}
	c, err := l.config(key, opts)
	if err != nil {
		return err
	}
	lk, err := l.wait(ctx, c, key)
	if err != nil {
		return err
	}
	return l.runKept(ctx, c, lk, fn)
}

// keeperFor is the Keeper of a call with config c: none with
// WithoutKeeper (nil), the Locker's (WithKeeper), or the process-wide
// default watchdog.
func (l *Locker) keeperFor(c lockConfig) Keeper {
	switch {
	case c.noKeeper:
		return nil
	case l.keeper != nil:
		return l.keeper
	default:
		return defaultKeeper()
	}
}

// cleanupInBackground reports whether cleanup after a failed call (a
// release, leaving a line) must run in the background: the caller has a
// deadline, which the cleanup must not hold it past, or its ctx ended.
func cleanupInBackground(ctx context.Context) bool {
	_, ok := ctx.Deadline()
	return ok || ctx.Err() != nil
}

// runKept is Do once lk is taken: fn runs under lk, kept alive by the
// call's keeper, and lk is released after fn returned (see Do).
func (l *Locker) runKept(ctx context.Context, c lockConfig, lk *Lock, fn func(ctx context.Context, lk *Lock) error) (err error) {
	stopKeeping := func() {}
	if k := l.keeperFor(c); k != nil {
		stopKeeping = k.Keep(lk)
	}

	// fn's ctx ends with the lock's loss; no goroutine waits for it (see
	// Lock.Context): 10,000 Do calls in fn cost timers, not goroutines.
	fnCtx, stopCtx := lk.Context(ctx)
	defer func() {
		stopCtx() // a loss (or fn's own release) being told has finished
		stopKeeping()
		lost := lk.Err() // read before Release: a lock released in time is not lost
		relCtx, relCancel := context.WithTimeout(context.WithoutCancel(ctx), releaseBound(lk))
		_ = lk.Release(relCtx)
		relCancel()
		err = withLoss(err, lost)
	}()
	return fn(fnCtx, lk)
}

// withLoss is what Do and DoAll return: fn's error err, and the loss of
// their lock (lost, nil if none) before fn returned: the loss alone when
// fn returned nil or the loss itself (its ctx's cause), both otherwise.
func withLoss(err, lost error) error {
	switch {
	case lost == nil:
		return err
	case err == nil:
		return lost
	case errors.Is(err, lost):
		return err // fn returned its ctx's cause: the loss itself
	default:
		return alsoLost{err, lost}
	}
}

// alsoLost is fn's error and the loss of Do's lock before fn returned, on
// one line, "<fn's error>; <the loss>", with the loss's "redlease: "
// prefix dropped if fn's error already shows one; errors.Is and errors.As
// see both.
type alsoLost [2]error

func (e alsoLost) Error() string {
	first, lost := e[0].Error(), e[1].Error()
	if strings.Contains(first, "redlease: ") {
		lost = strings.TrimPrefix(lost, "redlease: ")
	}
	return first + "; " + lost
}

func (e alsoLost) Unwrap() []error { return e[:] }

// releaseBound is how long Do waits for its release: the strategy's call
// bound (CallBounder; DefaultCallBound if it states none, or none that is
// positive), at most the lock's TTL.
func releaseBound(lk *Lock) time.Duration {
	bound := DefaultCallBound
	if b, ok := lk.strategy.(CallBounder); ok && b.CallBound() > 0 {
		bound = b.CallBound()
	}
	return min(bound, lk.TTL())
}
