package failover

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/backoff"
)

// DefaultPollInterval is how often a Watcher asks the Sentinels for the
// current primary and config epoch, as a backstop for a +switch-master
// message it missed.
const DefaultPollInterval = 500 * time.Millisecond

const (
	// maxAskTimeout caps how long a poll waits for one Sentinel; below it,
	// the cap is three quarters of the poll interval (askTimeout).
	maxAskTimeout = time.Second
	// startWait is the least time NewWatcher gives the Sentinels to answer.
	startWait = time.Second
	// minSubscribeTimeout is the least time a subscription attempt, or a
	// PING on a subscription, is given.
	minSubscribeTimeout = 500 * time.Millisecond
	// pingAfter is how long a subscription may stay silent before the
	// Watcher checks it with PING.
	pingAfter = time.Second
	// resubscribeMin and resubscribeMax bound the pause between attempts to
	// subscribe on one Sentinel; it doubles after each failed attempt.
	resubscribeMin = 100 * time.Millisecond
	resubscribeMax = 2 * time.Second
)

const switchChannel = "+switch-master"

// errStillAsking is the cause for a Sentinel left out of a poll because it
// has not answered the previous one yet.
var errStillAsking = errors.New("failover: previous question to this Sentinel still unanswered")

// Watcher revokes a Strategy's locks when Sentinel fails over, also when a
// failback names the same primary again. It listens for +switch-master on
// every Sentinel it is given, and polls them for the primary's address and
// config epoch in case a message was lost with a connection.
type Watcher struct {
	s          *Strategy
	master     string
	sents      []*sentinel
	interval   time.Duration
	askTimeout time.Duration // bounds one Sentinel's answer to a poll
	subTimeout time.Duration // bounds a subscription attempt, and a PING's answer
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	askNow     chan struct{} // buffer of one: a +switch-master came, poll at once

	mu          sync.Mutex
	closed      bool
	current     string // the primary's address as last seen
	epoch       int64  // the config epoch of the newest configuration a poll saw
	unconfirmed bool   // current came from a +switch-master no poll has heard since
	revoked     int
}

// sentinel is one of the Watcher's Sentinels.
type sentinel struct {
	i      int
	client *redis.SentinelClient
	jitter *backoff.Stream // listen's pauses (from NewWatcher's ctx)
	busy   atomic.Bool     // a question to it is still out
	ps     *redis.PubSub   // the subscription being made or read; guarded by Watcher.mu
}

// report is one Sentinel's answer: the primary's address and the config
// epoch of the configuration that names it.
type report struct {
	epoch int64
	addr  string
}

// NewWatcher starts a Watcher for master on sentinels (at least one; use all of
// them, so one Sentinel's trouble cannot hide a failover). It fails if no
// Sentinel names master's primary in time, and, with redlease.ErrInvalid,
// if s was built WithMaster with another name. pollInterval 0 means
// DefaultPollInterval. Close stops it. Start it before the strategy takes
// locks: the locks the strategy holds when NewWatcher first hears the Sentinels
// are revoked then (the epoch NewWatcher adopts counts any failover before it,
// so nothing later would tell of one those locks lived through).
//
// On a failover every lock the strategy granted and that is still held is
// marked lost, with a cause that errors.Is ErrFailover: its Lost
// closes and Locker.Do cancels its function. That is conservative: a lock
// the new primary did receive (WAIT covered it) is revoked too, and its
// holder must take it again; the key itself stays until it is released or
// expires, so the next holder waits for that, and gets a higher fence.
//
// A +switch-master message revokes at once and has the Sentinels asked at
// once. The message carries no config epoch, so the answer that tells of
// its failover, under a higher epoch, cannot be told from a second
// failover after it, and revokes again: a lock granted between the message
// and that answer is revoked too. That is about one round trip to the
// Sentinels, longer (up to a poll interval more each time) while no
// Sentinel that knows of the failover answers in time.
//
// One Sentinel's trouble does not blind the Watcher:
//
//   - Every poll asks all Sentinels at once, each in its own goroutine and
//     under its own timeout (three quarters of the poll interval, at most a
//     second, so that a poll has ended before the next is due), and decides
//     from those that answered in time. A Sentinel still busy with the
//     previous poll's question is left out rather than asked twice.
//   - Each Sentinel answers with the primary's address and the config epoch
//     of the configuration that names it (SENTINEL MASTER and SENTINEL
//     GET-MASTER-ADDR-BY-NAME). Sentinel raises the config epoch with every
//     failover, so one answering Sentinel is enough to act on: a config
//     epoch newer than the newest the Watcher has seen is a failover and
//     revokes, whatever address it names (a failover and a failback between
//     two polls name the same primary as before, which lost, as a replica
//     of the promoted one, whatever that one had not received), and so is
//     another address under the newest epoch. An answer with an older epoch
//     comes from a Sentinel that has not heard of the latest failover yet
//     and is ignored, so a lagging Sentinel cannot make the Watcher flip
//     back and forth.
//   - Every Sentinel has its own subscription, made again (pausing from
//     100 ms, doubling up to 2 s) whenever it fails or drops, for as long as
//     the Watcher runs; a subscription silent for a second is checked with
//     PING and made again if the PING goes unanswered.
//
// NewWatcher itself asks every Sentinel at once, each for at most ctx's time and
// a second; it returns when all have answered or
// failed, and takes the answer with the newest config epoch. If none
// answered, the error errors.Is redlease.ErrUnavailable, and each
// Sentinel's cause is a *redlease.NodeError whose Node is its index in
// sentinels.
//
// The Sentinel clients stay the caller's; the Watcher never closes them.
// Build them with ContextTimeoutEnabled (redis.NewSentinelClient(
// &redis.Options{Addr: addr, ContextTimeoutEnabled: true})): every call the
// Watcher makes carries a deadline, but without that option go-redis does
// not apply a context's deadline to socket reads, so a Sentinel that accepts
// connections and never answers would hold a call for the client's
// ReadTimeout (5 s by default) instead. Even then the other Sentinels are
// asked and heard meanwhile; only Close (and NewWatcher, if it fails) waits for
// such a call to end.
func NewWatcher(ctx context.Context, s *Strategy, master string, pollInterval time.Duration, sentinels ...*redis.SentinelClient) (*Watcher, error) {
	if s == nil || master == "" || len(sentinels) == 0 {
		return nil, redlease.Invalid("failover.NewWatcher: need a strategy, a master name and at least one Sentinel")
	}
	if m := s.Master(); m != "" && m != master {
		return nil, redlease.Invalid("failover.NewWatcher: master %q, but the strategy was built WithMaster(%q): a Watcher must watch the master the strategy locks on", master, m)
	}
	if pollInterval < 0 {
		return nil, redlease.Invalid("failover.NewWatcher: poll interval %v: must not be negative", pollInterval)
	}
	if pollInterval == 0 {
		pollInterval = DefaultPollInterval
	}
	sents := make([]*sentinel, len(sentinels))
	for i, sc := range sentinels {
		if sc == nil {
			return nil, redlease.Invalid("failover.NewWatcher: Sentinel %d is nil", i)
		}
		sents[i] = &sentinel{i: i, client: sc, jitter: backoff.NewStream(ctx, uint64(i))}
	}
	wctx, cancel := context.WithCancel(context.Background())
	w := &Watcher{s: s, master: master, sents: sents, interval: pollInterval,
		askTimeout: askTimeout(pollInterval), ctx: wctx, cancel: cancel,
		askNow: make(chan struct{}, 1)}
	w.subTimeout = max(min(pollInterval, maxAskTimeout), minSubscribeTimeout)

	sctx, scancel := context.WithTimeout(ctx, max(w.askTimeout, startWait))
	reports, errs := w.ask(sctx)
	scancel()
	if len(reports) == 0 {
		cancel()
		w.wg.Wait()
		format, args := "%w: failover.NewWatcher: no Sentinel named the primary of %q", []any{redlease.ErrUnavailable, master}
		for _, err := range errs {
			format += "; %w"
			args = append(args, err)
		}
		return nil, fmt.Errorf(format, args...)
	}
	best := reports[0]
	for _, r := range reports[1:] {
		if r.epoch > best.epoch {
			best = r
		}
	}
	w.current, w.epoch = best.addr, best.epoch
	// A lock the strategy took before this look may have lived through a
	// failover that the adopted epoch already counts: nothing would ever
	// revoke it.
	w.revoke(fmt.Errorf("%w: %s: held before the Watcher first asked the Sentinels (config epoch %d), a failover since its grant cannot be ruled out", ErrFailover, master, best.epoch))
	for _, sn := range w.sents {
		w.wg.Go(func() { w.listen(sn) })
	}
	w.wg.Go(w.poll)
	return w, nil
}

// askTimeout is how long a poll every interval waits for one Sentinel:
// three quarters of the interval (all of it below 4 ns), at most
// maxAskTimeout. A question that times out has ended, and its Sentinel is
// free to be asked again, before the next poll is due, rather than at the
// same instant.
func askTimeout(interval time.Duration) time.Duration {
	return min(interval-interval/4, maxAskTimeout)
}

// Primary returns the primary's address as the Watcher last saw it.
func (w *Watcher) Primary() string {
	if w == nil {
		return ""
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

// Revoked returns how many locks the Watcher has revoked so far.
func (w *Watcher) Revoked() int {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.revoked
}

// Close stops the Watcher's goroutines and subscriptions and waits for them
// to end. It does not close the Sentinel clients. With clients built as
// NewWatcher asks, it returns within about a second even while a Sentinel hangs:
// a call in flight to a hung Sentinel ends at its deadline. Calling Close
// again does nothing.
func (w *Watcher) Close() error {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	w.closed = true
	var subs []*redis.PubSub
	for _, sn := range w.sents {
		if sn.ps != nil {
			subs = append(subs, sn.ps)
		}
	}
	w.mu.Unlock()
	w.cancel()
	for _, ps := range subs {
		_ = ps.Close() // ends a read in progress at once
	}
	w.wg.Wait()
	return nil
}

// poll asks the Sentinels for the primary every interval, and at once after
// a +switch-master.
func (w *Watcher) poll() {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for w.next(t.C) {
		ctx, cancel := context.WithTimeout(w.ctx, w.askTimeout)
		reports, _ := w.ask(ctx)
		cancel()
		if len(reports) > 0 {
			w.observe(reports)
		}
	}
}

// next waits for the next poll: a tick, or a +switch-master (askNow). It
// reports false once the Watcher is closing. One poll serves a tick and a
// +switch-master that are both pending (a poll that outlasted an interval
// and heard a message meanwhile): a select picks one of them at random, and
// the other would start a second poll at once, or not, as the runtime drew.
func (w *Watcher) next(tick <-chan time.Time) bool {
	select {
	case <-tick:
	case <-w.askNow:
	case <-w.ctx.Done():
	}
	if w.ctx.Err() != nil {
		return false
	}
	select {
	case <-tick:
	default:
	}
	select {
	case <-w.askNow:
	default:
	}
	return true
}

// ask puts the question to every Sentinel that has none outstanding, each in
// its own goroutine under ctx, and returns the answers that came before ctx
// ended, and a *redlease.NodeError for every Sentinel that gave none. A
// Sentinel that does not answer delays nobody but itself: its goroutine
// ends at ctx's deadline (or, with a client that ignores deadlines, at its
// read timeout, and the Sentinel is left out of polls until then).
func (w *Watcher) ask(ctx context.Context) ([]report, []error) {
	type answer struct {
		i   int
		r   report
		err error
	}
	answers := make(chan answer, len(w.sents))
	pending := make([]bool, len(w.sents))
	var errs []error
	asked := 0
	for _, sn := range w.sents {
		if !sn.busy.CompareAndSwap(false, true) {
			errs = append(errs, &redlease.NodeError{Node: sn.i, Err: errStillAsking})
			continue
		}
		pending[sn.i] = true
		asked++
		w.wg.Go(func() {
			r, err := w.askOne(ctx, sn.client)
			sn.busy.Store(false)
			answers <- answer{sn.i, r, err} // buffered: never blocks
		})
	}
	var reports []report
	for ; asked > 0; asked-- {
		select {
		case a := <-answers:
			pending[a.i] = false
			if a.err != nil {
				errs = append(errs, &redlease.NodeError{Node: a.i, Err: a.err})
				continue
			}
			reports = append(reports, a.r)
		case <-ctx.Done():
			for i, p := range pending {
				if p {
					errs = append(errs, &redlease.NodeError{Node: i, Err: ctx.Err()})
				}
			}
			return reports, errs
		}
	}
	return reports, errs
}

// askOne asks one Sentinel for the config epoch of master's configuration
// and the primary's address.
func (w *Watcher) askOne(ctx context.Context, sc *redis.SentinelClient) (report, error) {
	m, err := sc.Master(ctx, w.master).Result()
	if err != nil {
		return report{}, err
	}
	epoch, err := strconv.ParseInt(m["config-epoch"], 10, 64)
	if err != nil {
		return report{}, fmt.Errorf("SENTINEL MASTER %s: config-epoch: %w", w.master, err)
	}
	// The address comes from GET-MASTER-ADDR-BY-NAME, which the Sentinel
	// leading a failover answers with the promoted replica as soon as it is
	// promoted, before SENTINEL MASTER names it (and as go-redis's failover
	// client asks).
	a, err := sc.GetMasterAddrByName(ctx, w.master).Result()
	if err != nil {
		return report{}, err
	}
	if len(a) != 2 {
		return report{}, fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME %s: unexpected reply %q", w.master, a)
	}
	return report{epoch: epoch, addr: net.JoinHostPort(a[0], a[1])}, nil
}

// observe acts on one poll's answers. The newest configuration among them
// (highest config epoch; between equal epochs, one naming another address
// than the current one) decides:
//
//   - older than the newest the Watcher has seen: stale, ignored;
//   - newer: a failover, which revokes, whatever address it names: a
//     failover and a failback between two polls name the same primary
//     under a higher epoch, and the primary may have lost locks to the
//     replica that was promoted in between. That holds after a
//     +switch-master too: the poll that hears of the message's failover
//     cannot tell it from a later one, so it revokes again;
//   - as new, while the current address came from a +switch-master: the
//     configuration the message replaced, ignored;
//   - as new, naming the current address: nothing moved;
//   - as new, naming another address: a move, which revokes.
func (w *Watcher) observe(reports []report) {
	w.mu.Lock()
	best := reports[0]
	for _, r := range reports[1:] {
		if r.epoch > best.epoch || r.epoch == best.epoch && best.addr == w.current && r.addr != w.current {
			best = r
		}
	}
	was := w.epoch
	moved := false
	switch {
	case best.epoch < w.epoch:
	case best.epoch == w.epoch && (w.unconfirmed || best.addr == w.current):
	default:
		w.current, w.epoch, w.unconfirmed = best.addr, best.epoch, false
		moved = true
	}
	w.mu.Unlock()
	if moved {
		w.revoke(fmt.Errorf("%w: %s at %s under config epoch %d (was %d)", ErrFailover, w.master, best.addr, best.epoch, was))
	}
}

// onSwitch handles "<master> <old-ip> <old-port> <new-ip> <new-port>". A
// message that names another address than the current one revokes at once.
// Every message has the Sentinels asked at once, since a message carries no
// epoch: the poll that hears of its failover sees a higher config epoch and
// revokes (again, see observe), and asking at once keeps what that costs to
// the locks granted within one round trip to the Sentinels. A message that
// names the current address is another Sentinel's copy of one already
// heard, or tells of a failover and failback the Watcher missed; the poll
// tells which.
func (w *Watcher) onSwitch(payload string) {
	f := strings.Fields(payload)
	if len(f) != 5 || f[0] != w.master {
		return
	}
	addr := net.JoinHostPort(f[3], f[4])
	w.mu.Lock()
	moved := addr != w.current
	if moved {
		w.current, w.unconfirmed = addr, true
	}
	w.mu.Unlock()
	select {
	case w.askNow <- struct{}{}:
	default: // a poll is due at once already
	}
	if moved {
		w.revoke(fmt.Errorf("%w: %s now at %s (+switch-master)", ErrFailover, w.master, addr))
	}
}

// revoke marks every lock of the strategy lost with cause and counts them.
func (w *Watcher) revoke(cause error) {
	n := w.s.RevokeAll(cause)
	w.mu.Lock()
	w.revoked += n
	w.mu.Unlock()
}

// listen keeps a subscription to +switch-master on one Sentinel until the
// Watcher closes, making it again after every failure with a jittered
// pause that doubles from resubscribeMin up to resubscribeMax, and starts
// again from resubscribeMin once a subscription was made.
func (w *Watcher) listen(sn *sentinel) {
	delay := resubscribeMin
	for w.ctx.Err() == nil {
		if w.subscribe(sn) {
			delay = resubscribeMin
		}
		pause := delay/2 + sn.jitter.N(delay/2+1)
		select {
		case <-w.ctx.Done():
			return
		case <-time.After(pause):
		}
		delay = min(2*delay, resubscribeMax)
	}
}

// subscribe makes one subscription on sn and reads it until it fails, goes
// silent (a PING unanswered), or the Watcher closes. It reports whether the
// subscription was made.
func (w *Watcher) subscribe(sn *sentinel) (made bool) {
	ps := sn.client.Subscribe(w.ctx) // no channel yet: no connection either
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		_ = ps.Close()
		return false
	}
	sn.ps = ps
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		sn.ps = nil
		w.mu.Unlock()
		_ = ps.Close()
	}()

	ctx, cancel := context.WithTimeout(w.ctx, w.subTimeout)
	err := ps.Subscribe(ctx, switchChannel)
	var msg any
	if err == nil {
		msg, err = ps.ReceiveTimeout(ctx, w.subTimeout)
	}
	cancel()
	if _, ok := msg.(*redis.Subscription); err != nil || !ok {
		return false
	}

	heard := time.Now() // anything read proves the connection alive
	var pinged time.Time
	for {
		wait := time.Until(heard.Add(pingAfter))
		if !pinged.IsZero() {
			wait = time.Until(pinged.Add(w.subTimeout))
		}
		wait = max(wait, time.Millisecond)
		ctx, cancel := context.WithTimeout(w.ctx, wait)
		msg, err := ps.ReceiveTimeout(ctx, wait)
		cancel()
		switch {
		case w.ctx.Err() != nil:
			return true
		case err == nil:
			heard, pinged = time.Now(), time.Time{}
			if m, ok := msg.(*redis.Message); ok {
				w.onSwitch(m.Payload)
			}
		case !isTimeout(err):
			return true // dropped
		case !pinged.IsZero():
			return true // PING unanswered: the Sentinel hangs, or the link does
		default:
			ctx, cancel := context.WithTimeout(w.ctx, w.subTimeout)
			err := ps.Ping(ctx)
			cancel()
			if err != nil {
				return true
			}
			pinged = time.Now()
		}
	}
}

// isTimeout reports whether err is a read that timed out.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) ||
		errors.As(err, &ne) && ne.Timeout()
}
