package redlease

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Elector is a Strategy that can hold an election on a lock key: it keeps
// the leader's record (its term and value) beside the key, written only
// while the key holds the leader's token, reads it back, and tells
// observers when a leader proclaims. single and failover implement it;
// quorum does not (see the package documentation, Leader election), and
// NewElection refuses a strategy that does not.
//
// Every method is bounded by the strategy's call bound (CallBounder;
// DefaultCallBound otherwise) or ctx, whichever ends first, whatever the
// go-redis client's options.
type Elector interface {
	// Proclaim records value for term beside key, in one atomic step and
	// only if key holds token there, and publishes term on the election's
	// channel; with write false it only keeps the token's own record
	// alive (its TTL raised to at least ttl, and never below the key's)
	// and publishes nothing. It returns an error that errors.Is
	// ErrNotHeld when key does not hold token (nothing was written), and
	// ErrUnavailable when the node did not answer.
	Proclaim(ctx context.Context, key, token string, term uint64, value string, ttl time.Duration, write bool) error
	// Leader reads key's holder and record in one atomic step. It returns
	// an error that errors.Is ErrNoLeader when nobody holds key, or its
	// holder has recorded no value yet, and ErrUnavailable when the node
	// did not answer: never another holder's record.
	Leader(ctx context.Context, key string) (Leader, error)
	// WatchLeader subscribes to key's proclamations and releases, and
	// returns once the node confirmed the subscription (so that a
	// proclamation after it is heard), or with an error.
	WatchLeader(ctx context.Context, key string) (LeaderWatch, error)
}

// LeaderWatch is a subscription to an election's changes (see
// Elector.WatchLeader). It is used by one goroutine at a time.
type LeaderWatch interface {
	// Wait waits at most d (and never past ctx) for a notice: a
	// proclamation or a release of the key. It reports true on a notice,
	// false when d passed without one, and an error when the subscription
	// broke (a notice may have been missed; close it and subscribe again).
	Wait(ctx context.Context, d time.Duration) (bool, error)
	// Close ends the subscription and its connection.
	Close() error
}

// Leader is an election's leader as its key's node records it: its term
// (the fence of its lock) and the value it proclaimed last.
type Leader struct {
	Term  uint64
	Value string
}

// ErrNoLeader means an election has no leader that can be reported:
// nobody holds its key, or its holder has not recorded its value yet (a
// Campaign between its grant and its record, one round trip).
var ErrNoLeader = errors.New("redlease: no leader")

// Election is a leader election on one lock key: at most one leader at a
// time, each with a term (its lock's fence) strictly above every earlier
// leader's, under the strategy's assumptions (see the package
// documentation, Leader election). It is safe for concurrent use; one
// Election serves any number of Campaign, Leader and Observe calls. On a
// nil *Election, Campaign and Leader return ErrInvalid and Observe a
// closed channel.
type Election struct {
	l     *Locker
	key   string // as given
	full  string // with the Locker's prefix
	el    Elector
	poll  time.Duration // Observe's fallback poll
	bound time.Duration // each call to the strategy
}

// NewElection returns the election on key of l's default strategy. The
// strategy must be an Elector with fencing on (single and failover by
// default): a leader's term is its fence. Anything else, an empty key and
// a nil Locker are refused with an error that errors.Is ErrInvalid (the
// quorum strategy is not an Elector: see the package documentation).
func NewElection(l *Locker, key string) (*Election, error) {
	if l == nil {
		return nil, Invalid("nil Locker")
	}
	if key == "" {
		return nil, Invalid("empty election key")
	}
	s := l.defaults.strategy
	el, ok := s.(Elector)
	if !ok {
		return nil, Invalid("strategy %T cannot hold an election (it is not a redlease.Elector; the quorum strategy is not)", s)
	}
	if f, ok := s.(Fencer); !ok || !f.Fencing() {
		return nil, Invalid("strategy %T has no fences: an election's terms are fences", s)
	}
	bound := DefaultCallBound
	if b, ok := s.(CallBounder); ok && b.CallBound() > 0 {
		bound = b.CallBound()
	}
	return &Election{l: l, key: key, full: l.prefix + key, el: el, poll: l.defaults.maxDelay, bound: bound}, nil
}

// Key returns the election's key as given (without the Locker's prefix).
func (e *Election) Key() string {
	if e == nil {
		return ""
	}
	return e.key
}

// Campaign waits until this caller is elected, and records value as the
// leader's: it takes the election's key as Locker.Lock does (retries,
// backoff, wake on release; opts as for Lock), keeps the lock alive with
// the Locker's keeper as Do does (WithKeeper, or the process-wide default
// watchdog), records value beside the key under the lock's token, and
// publishes it to observers. The Leadership's Term is the lock's fence.
//
// WithoutKeeper is allowed: the leadership then ends within its first
// TTL, less the loss margin, unless the caller extends its lock.
//
// The Leadership owns one goroutine, which keeps the leader's record alive
// as long as its lock (a refresh under the token compare every third of
// the lock's TTL); it ends with Resign (which waits for it) or the loss.
//
// Campaign returns the error of Lock if it was not elected (ctx's error
// among it), and, if it was elected but could not record its value, that
// error, and releases the key within the strategy's call bound (in the
// background when ctx has a deadline or is done, so that Campaign returns
// by ctx's deadline). A record that failed never names this caller once
// the key is released: Leader reports a record only beside its holder.
func (e *Election) Campaign(ctx context.Context, value string, opts ...LockOption) (*Leadership, error) {
	if e == nil {
		return nil, Invalid("nil Election")
	}
	c, err := e.l.config(e.key, opts)
	if err != nil {
		return nil, err
	}
	if !comparableStrategy(c.strategy) || c.strategy != e.l.defaults.strategy {
		// Leader and Observe read through the Locker's strategy: a
		// campaign elsewhere would lead an election nobody sees.
		return nil, Invalid("Campaign: WithStrategy %T: an election campaigns through its Locker's strategy", c.strategy)
	}
	el := e.el
	lk, err := e.l.wait(ctx, c, e.key)
	if err != nil {
		return nil, err
	}
	stopKeeping := func() {}
	if k := e.l.keeperFor(c); k != nil {
		stopKeeping = k.Keep(lk)
	}
	ld := &Leadership{e: e, el: el, lk: lk, stopKeeping: stopKeeping, value: value,
		stop: make(chan struct{}), done: make(chan struct{})}
	if err := ld.proclaim(ctx, value, true); err != nil {
		close(ld.done)
		resign := func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseBound(lk))
			_ = ld.resign(rctx)
			cancel()
		}
		if cleanupInBackground(ctx) {
			// The release must not hold the caller past its deadline:
			// it finishes in the background, within its bound.
			go resign()
		} else {
			resign()
		}
		return nil, fmt.Errorf("redlease: elected, but the leader's value was not recorded: %w", err)
	}
	go ld.refresh()
	return ld, nil
}

// Leader returns the election's current leader as its key's node records
// it: its term and value. It writes nothing, reads the holder and the
// record in one atomic step (a deposed leader's record is never reported
// beside a newer holder), and is bounded by the strategy's call bound or
// ctx. It returns an error that errors.Is ErrNoLeader when there is none
// to report, ErrUnavailable when the node did not answer.
func (e *Election) Leader(ctx context.Context) (Leader, error) {
	if e == nil {
		return Leader{}, Invalid("nil Election")
	}
	ctx, cancel := context.WithTimeout(ctx, e.bound)
	defer cancel()
	return e.el.Leader(ctx, e.full)
}

// Observe returns a channel of the election's leaders, in rising terms:
// the current one first (if any), then each new term, and each new value
// a leader proclaims in its term, as its reads find them: a value
// replaced, or whose leader resigned, before the read that a notice
// starts is not reported, only what came after it. It learns of changes without polling
// where it can: it subscribes to the election's proclamations and
// releases before its first read, and reads the leader on each notice.
// Notices are hints (a broken connection, an ACL that denies SUBSCRIBE):
// it also reads the leader at least every max retry delay of the Locker
// (WithRetryDelay), which bounds what a lost notice costs. A leader whose
// key expires publishes nothing; the next leader's record does. Observe
// never reports a term below one it reported (a failover that lost
// writes can bring an older record back: see the package documentation).
//
// One goroutine, owned by ctx, runs until ctx ends; then the channel is
// closed. It waits for the reader: a leader that changes twice while the
// reader is away is reported once, at its latest.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	ch := make(chan Leader)
	if e == nil {
		close(ch)
		return ch
	}
	go e.observe(ctx, ch)
	return ch
}

// observe is Observe's goroutine.
func (e *Election) observe(ctx context.Context, ch chan<- Leader) {
	defer close(ch)
	var (
		w    LeaderWatch
		last Leader
		seen bool
	)
	defer func() {
		if w != nil {
			_ = w.Close()
		}
	}()
	for ctx.Err() == nil {
		if w == nil {
			wctx, cancel := context.WithTimeout(ctx, e.bound)
			w, _ = e.el.WatchLeader(wctx, e.full)
			cancel()
		}
		cur, err := e.Leader(ctx)
		if err == nil && (!seen || cur.Term > last.Term || (cur.Term == last.Term && cur.Value != last.Value)) {
			select {
			case ch <- cur:
				last, seen = cur, true
			case <-ctx.Done():
				return
			}
		}
		if w == nil {
			t := time.NewTimer(e.poll)
			select {
			case <-ctx.Done():
			case <-t.C:
			}
			t.Stop()
			continue
		}
		if _, err := w.Wait(ctx, e.poll); err != nil {
			_ = w.Close()
			w = nil
		}
	}
}
