// Package primary is the lock logic on one Redis primary, shared by the
// single strategy (no replica acknowledgement) and the failover strategy
// (every write acknowledged by replicas with WAIT in the same round trip).
package primary

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/bounded"
	"github.com/redlease/redlease/internal/drift"
	"github.com/redlease/redlease/internal/fused"
	"github.com/redlease/redlease/internal/nodes"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/internal/wake"
)

// Config is what differs between the strategies built on Primary.
type Config struct {
	Fencing     bool
	DriftFactor float64
	// Replicas > 0: every acquire and extend is followed, in the same
	// pipeline on the same connection, by WAIT Replicas WaitTimeout.
	Replicas int
	// AllReplicas, on a Cluster client: every acquire and extend runs on
	// the key's master, followed in the same pipeline by WAIT for every
	// replica its shard lists, and at least Replicas (clusterwait.go).
	// Ignored on other clients.
	AllReplicas bool
	WaitTimeout time.Duration
	// Clock judges validity (nil: the system clock).
	Clock redlease.Clock
	// FenceTTL > 0: a fence counter expires this long after its last
	// grant; 0: after script.FenceTTL's default.
	FenceTTL time.Duration
	// Master, if set, is the Sentinel master name the client follows
	// (failover.WithMaster): Placement names it, not the client's
	// address.
	Master string
}

// Primary runs the lock scripts on one client. It is safe for concurrent
// use and does not own the client.
type Primary struct {
	client  redis.UniversalClient
	addr    string
	cfg     Config
	cluster *redis.ClusterClient // client, if it is a Cluster client: ExtendBatch groups keys by master
	// bound: the client does not apply ctx deadlines to its socket I/O
	// (go-redis without ContextTimeoutEnabled waits for its ReadTimeout and
	// retries), so calls are bounded by ctx here (see call).
	bound     bool
	deadlines *bounded.Deadlines   // of calls whose ctx has none: CallBound
	cells     bounded.Cells[int64] // the hand-offs of bounded calls
	// ttlArgs: the boxed TTL arguments of the last TTL acquired or
	// extended with, reused while the next call has the same TTL.
	ttlArgs atomic.Pointer[ttlArgs]
	wake    *wake.Set // release notices for waiters (Watch); nil with a nil client

	// The clean-ups of failed acquisitions, run in the background (see
	// undoLater): life ends at Close, which waits for them.
	life    context.Context
	endLife context.CancelFunc
	undoMu  sync.Mutex
	closed  bool
	undos   sync.WaitGroup

	// silent: the Cluster masters that left a call without a reply, and
	// when (topology.go).
	silentMu sync.Mutex
	silent   map[string]time.Time
	silentN  atomic.Int32 // len(silent), read without the mutex

	// replicas: the Cluster masters' replica counts (AllReplicas).
	replicas replicaCounts
	// nodes: the Cluster client's node clients this Primary saw (those it
	// made after New, by its OnNewNode, and those calls were routed to), by
	// address, for a redirection to a node the topology does not name yet
	// (masterAt).
	nodes sync.Map
}

// ErrNotReplicated is failover.ErrNotReplicated, defined here because
// Primary makes it and failover imports this package.
var ErrNotReplicated = errors.New("redlease: write not acknowledged by enough replicas")

// WatchBound is how long Watch waits for the node to confirm a
// subscription: a node that cannot in that time is no worse than polling.
const WatchBound = time.Second

// CloseWait is how long Close waits at most for the subscription
// connection it leaves idle to stop: one on a live connection stops within
// a few scheduling delays; one that go-redis is dialing to a hung node
// cannot stop before the dial gives up, at the client's DialTimeout and
// ReadTimeout, and is left to stop then.
const CloseWait = 100 * time.Millisecond

// UndoBound bounds the clean-up of a failed acquisition (undoLater), which
// runs in the background: the caller of the acquisition does not wait for
// it.
const UndoBound = redlease.DefaultCallBound

// CallBound bounds each call to the node whose ctx has no deadline:
// redlease.DefaultCallBound, plus the WAIT timeout when replicas are
// required (WAIT runs in the same round trip). A call with a deadline is
// bounded by it alone.
func (p *Primary) CallBound() time.Duration {
	return redlease.DefaultCallBound + p.cfg.WaitTimeout
}

// Defaults is the configuration the strategies start from: fencing on, the
// default drift factor, no replicas.
func Defaults() Config {
	return Config{Fencing: true, DriftFactor: drift.DefaultFactor}
}

// New returns a Primary on client, configured by cfg with opts applied in
// order by apply (nil options are skipped): the option plumbing of single
// and failover, whose options are each their own type. A nil client or
// the first rejected option is returned as an error that errors.Is
// redlease.ErrInvalid.
func New[O any](client redis.UniversalClient, cfg Config, opts []O, apply func(O, *Config) error) (*Primary, error) {
	if nodes.IsNil(client) {
		return nil, redlease.Invalid("nil client")
	}
	for _, o := range opts {
		if any(o) == nil {
			continue
		}
		if err := apply(o, &cfg); err != nil {
			return nil, err
		}
	}
	if cfg.Clock == nil {
		cfg.Clock = redlease.SystemClock()
	}
	p := &Primary{client: client, cfg: cfg}
	p.addr = nodes.Addr(client)
	p.wake = wake.NewSet(client)
	p.cluster, _ = client.(*redis.ClusterClient)
	if p.cluster != nil {
		// Called under go-redis's node-table lock: a store, nothing else.
		p.cluster.OnNewNode(p.remember)
	}
	p.bound = !bounded.HonorsContext(client)
	p.deadlines = bounded.NewDeadlines(p.CallBound())
	p.life, p.endLife = context.WithCancel(context.Background())
	return p, nil
}

// call runs c, and returns when it does or, for a client that ignores
// contexts, when ctx is done, whichever comes first: with go-redis's
// defaults a paused node would otherwise hold the caller for the read
// timeout and its retries, whatever ctx says. A ctx without a deadline
// gets one at most CallBound away (bounded.Deadlines: shared with the
// calls that start about when it does). An abandoned call finishes in the
// background (bounded by the client's own timeouts, or its Close) and then
// undoes what it may have written if c says so (see scriptCall.Late).
func (p *Primary) call(ctx context.Context, c *scriptCall) (int64, error) {
	ctx, cancel := p.deadlines.Bound(ctx)
	defer cancel()
	return p.cells.Call(ctx, p.bound, c)
}

// scriptCall is one script call of Primary, in one allocation with its
// command line: the bounded.Job that call runs.
type scriptCall struct {
	p  *Primary
	sc *script.Script
	// replicated: followed by WAIT when replicas are required (see run).
	replicated bool
	// undo: an acquisition, which once abandoned is undone (by key and
	// this attempt's token) unless it surely wrote nothing.
	undo       bool
	key, token string
	line       []any
	buf        [13]any // line's first 13 arguments (all but fair mode's)
}

// newCall returns a call of sc; its line is to be appended to c.line.
func (p *Primary) newCall(sc *script.Script) *scriptCall {
	c := &scriptCall{p: p, sc: sc}
	c.line = c.buf[:0]
	return c
}

// Do sends the call (see bounded.Job).
func (c *scriptCall) Do(ctx context.Context) (int64, error) {
	if c.replicated {
		return c.p.run(ctx, c.sc, c.key, c.line)
	}
	return c.sc.Run(ctx, c.p.client, c.line)
}

// Late undoes an abandoned acquisition, which is reported as not
// obtained, by this attempt's token only, unless its outcome proves it
// wrote nothing (see bounded.Job).
func (c *scriptCall) Late(v int64, err error) {
	if c.undo && !wroteNothing(v, err) {
		c.p.undoLater(nil, c.key, c.token)
	}
}

// wroteNothing reports whether an acquisition's outcome proves it wrote
// nothing: a refusal, a fused script's own answer (ErrNotObtained), or an
// error that says it was never sent.
func wroteNothing(v int64, err error) bool {
	if err != nil {
		return notSent(err) || errors.Is(err, redlease.ErrNotObtained)
	}
	return script.IsTaken(v)
}

// fusedCall is a fused acquisition's call (see AcquireFused), in one
// allocation with its command line: the bounded.Job that acquire runs.
type fusedCall struct {
	f          fused.Script
	key, token string
	ttl        time.Duration // the lock's: it bounds the undo of an abandoned call
	line       []any
	buf        [12]any
}

// Do sends the call (see bounded.Job).
func (c *fusedCall) Do(ctx context.Context) (int64, error) { return c.f.Run(ctx, c.line) }

// Late undoes an abandoned call, by this attempt's token only, with f's
// Undo bounded by the lock's TTL, unless its outcome proves it wrote
// nothing (see bounded.Job).
func (c *fusedCall) Late(v int64, err error) {
	if wroteNothing(v, err) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.ttl)
	defer cancel()
	c.f.Undo(ctx, c.key, c.token)
}

// ttlArgs are the TTL arguments of Acquire and Extend, boxed.
type ttlArgs struct {
	ttl      time.Duration
	millis   any // ttl in ms
	fenceTTL any // script.FenceTTL's
}

// boxedTTL returns ttl's arguments: those of the last call if it had the
// same TTL (most callers use one), else new ones, kept for the next call.
func (p *Primary) boxedTTL(ttl time.Duration) *ttlArgs {
	if a := p.ttlArgs.Load(); a != nil && a.ttl == ttl {
		return a
	}
	a := &ttlArgs{ttl: ttl, millis: ttl.Milliseconds(), fenceTTL: script.FenceTTL(p.cfg.FenceTTL, ttl)}
	p.ttlArgs.Store(a)
	return a
}

// Acquire takes key in one round trip (plus WAIT in the same pipeline when
// replicas are required). A grant that too few replicas acknowledged is
// released at once and reported as an outage (ErrAcquireUnavailable: it
// matches redlease.ErrUnavailable, not ErrNotObtained) and not replicated.
func (p *Primary) Acquire(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	return p.acquire(ctx, key, token, ttl, nil, nil)
}

// AcquireFused is Acquire running f in place of script.Acquire (see
// internal/fused): the same checks, the same validity and refusals, the
// same classification of failures, with these differences, which are f's
// caller's (the idempotency Barrier's claim): no replicas are waited for;
// the call is bounded by ctx alone, not by CallBound; f's own answer
// (ErrNotObtained) comes back as it is; and what a failed attempt may
// have written is undone by f.Undo, by this attempt's token, before
// AcquireFused returns (bounded by a tenth of ttl, the Locker's default
// loss margin, past ctx's end), or, for a call abandoned at ctx's end,
// when its reply comes.
func (p *Primary) AcquireFused(ctx context.Context, key, token string, ttl time.Duration, f fused.Script) (redlease.Grant, error) {
	if f == nil {
		return redlease.Grant{}, redlease.Invalid("nil fused script")
	}
	return p.acquire(ctx, key, token, ttl, nil, f)
}

// AcquireInLine is Acquire in fair mode (see redlease.Queuer).
func (p *Primary) AcquireInLine(ctx context.Context, key, token string, ttl time.Duration, place redlease.Place) (redlease.Grant, error) {
	if err := script.CheckPlace(place); err != nil {
		return redlease.Grant{}, err
	}
	return p.acquire(ctx, key, token, ttl, &place, nil)
}

// LeaveLine removes waiter id's entry from key's line (see
// redlease.Queuer), in one round trip bounded by ctx.
func (p *Primary) LeaveLine(ctx context.Context, key, id string) error {
	if key == "" || id == "" {
		return redlease.Invalid("empty key or waiter id")
	}
	c := p.newCall(script.Leave)
	c.line = script.AppendLeaveArgs(c.line, key, id)
	_, err := p.call(ctx, c)
	if err != nil {
		return p.fail(ctx, key, redlease.ErrUnavailable, err)
	}
	return nil
}

// acquire is Acquire, in fair mode when place is not nil, running f in
// place of script.Acquire when f is not nil (AcquireFused).
func (p *Primary) acquire(ctx context.Context, key, token string, ttl time.Duration, place *redlease.Place, f fused.Script) (redlease.Grant, error) {
	if err := p.check(key, token, ttl); err != nil {
		return redlease.Grant{}, err
	}
	if err := ctx.Err(); err != nil {
		return redlease.Grant{}, redlease.Wrap(redlease.ErrNotObtained, context.Cause(ctx))
	}
	if p.cfg.FenceTTL > 0 && ttl > p.cfg.FenceTTL {
		return redlease.Grant{}, redlease.Invalid("ttl %v: longer than the fence counter TTL %v (WithFenceTTL), which must be at least every TTL acquired with", ttl, p.cfg.FenceTTL)
	}
	ta := p.boxedTTL(ttl)
	start := p.cfg.Clock.Now()
	var (
		v   int64
		err error
	)
	if f != nil {
		c := &fusedCall{f: f, key: key, token: token, ttl: ttl}
		c.line = f.AppendLine(c.buf[:0], key, script.MustFenceKey(key), token, ta.millis, ta.fenceTTL)
		v, err = p.cells.Call(ctx, p.bound, c)
	} else {
		c := p.newCall(script.Acquire)
		c.replicated, c.undo, c.key, c.token = true, true, key, token
		c.line = p.appendAcquire(c.line, key, token, ta, place)
		v, err = p.call(ctx, c)
	}
	p.heard(ctx, key, err)
	// Every undo below compares this attempt's token (the Locker gives each
	// attempt its own), so however late it lands it removes only what this
	// attempt wrote, never a key a later attempt holds. It runs in the
	// background, so that the caller's deadline holds; where the node
	// answered, the caller waits for it while its ctx lasts.
	switch {
	case f != nil && errors.Is(err, redlease.ErrNotObtained):
		return redlease.Grant{}, err // f's answer: it took nothing
	case errors.Is(err, ErrNotReplicated) && !script.IsTaken(v):
		p.undoLater(ctx, key, token)
		// Nobody refused: the write was not confirmed, an outage (or WAIT
		// was denied: a configuration error).
		sentinel := ErrAcquireUnavailable
		if nodes.Denied(err) {
			sentinel = redlease.ErrDenied
		}
		return redlease.Grant{}, redlease.Wrap(sentinel, err)
	case err != nil:
		var ab bounded.Abandoned
		if !notSent(err) && !errors.As(err, &ab) { // an abandoned call undoes itself when it returns
			// The script may have run and its reply been lost (a timeout,
			// a cut connection), or failed after its SET: without this the
			// key would block every other attempt until its TTL. The
			// node did not answer: nobody waits for it.
			p.undoFailed(ctx, nil, f, key, token, ttl)
		}
		// Down is not held: the node failed, nobody refused.
		return redlease.Grant{}, p.fail(ctx, key, ErrAcquireUnavailable, err)
	case v == script.Queued:
		return redlease.Grant{}, redlease.Wrap(redlease.ErrNotObtained, redlease.ErrQueued)
	case script.IsTaken(v):
		if d, ok := script.Remaining(v); ok {
			return redlease.Grant{}, &redlease.HeldError{Remaining: d}
		}
		return redlease.Grant{}, redlease.ErrNotObtained
	}
	until := start.Add(ttl - p.DriftAllowance(ttl))
	if !p.cfg.Clock.Now().Before(until) {
		p.undoFailed(ctx, ctx, f, key, token, ttl)
		return redlease.Grant{}, fmt.Errorf("%w: no validity left after %v", redlease.ErrNotObtained, p.cfg.Clock.Now().Sub(start))
	}
	return redlease.Grant{Until: until, Fence: uint64(v)}, nil
}

// appendAcquire appends script.Acquire's command line for key under token
// (fair mode's place, if not nil) to line.
func (p *Primary) appendAcquire(line []any, key, token string, ta *ttlArgs, place *redlease.Place) []any {
	k := any(key) // boxed once, passed for every key the script does not touch
	mode, fenceKey := any(script.NoFence), k
	if p.cfg.Fencing {
		mode, fenceKey = any(script.IncrFence), any(script.MustFenceKey(key))
	}
	queue := k // KEYS[4], the line: read only in fair mode
	if place != nil {
		queue = any(script.QueueKey(key))
	}
	line = script.Acquire.AppendArgs(line, k, fenceKey, k, queue, token, ta.millis, mode,
		any(script.RuleOff), any(script.NotDurable), ta.fenceTTL)
	if place != nil {
		line = script.AppendPlace(line, *place)
	}
	return line
}

// notSent reports whether err proves the request never reached the server
// or was refused before it ran (no connection could be made, the server
// did not know the script, or it denied the client: nodes.Denied), so
// that it wrote nothing to undo.
func notSent(err error) bool {
	var op *net.OpError
	return (errors.As(err, &op) && op.Op == "dial") || errors.Is(err, redis.ErrPoolTimeout) || script.IsNoScript(err) || nodes.Denied(err)
}

// Extend raises key's TTL to ttl if it still holds token (script.Extend:
// never shortened), in one round trip. An
// extension too few replicas acknowledged is undecided (ErrUnavailable and
// ErrNotReplicated): the lock keeps its previous Until.
func (p *Primary) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	if err := p.check(key, token, ttl); err != nil {
		return redlease.Grant{}, err
	}
	start := p.cfg.Clock.Now()
	c := p.newCall(script.Extend)
	c.replicated, c.key = true, key
	c.line = script.Extend.AppendArgs(c.line, key, token, p.boxedTTL(ttl).millis)
	v, err := p.call(ctx, c)
	p.heard(ctx, key, err)
	switch {
	case err == nil && v != 1, errors.Is(err, ErrNotReplicated) && v != 1:
		return redlease.Grant{}, redlease.ErrNotHeld
	case errors.Is(err, ErrNotReplicated):
		return redlease.Grant{}, redlease.Wrap(redlease.ErrUnavailable, err)
	case err != nil:
		return redlease.Grant{}, p.fail(ctx, key, redlease.ErrUnavailable, err)
	}
	until := start.Add(ttl - p.DriftAllowance(ttl))
	if !p.cfg.Clock.Now().Before(until) {
		return redlease.Grant{}, fmt.Errorf("%w: no validity left after %v", redlease.ErrNotHeld, p.cfg.Clock.Now().Sub(start))
	}
	return redlease.Grant{Until: until}, nil
}

// Release deletes key if it still holds token, in one round trip. It does
// not wait for replicas: a release that a failover loses only leaves the key
// to expire.
func (p *Primary) Release(ctx context.Context, key, token string) error {
	if key == "" {
		return redlease.Invalid("empty key")
	}
	c := p.newCall(script.Release)
	c.line = script.AppendReleaseArgs(c.line, key, token)
	v, err := p.call(ctx, c)
	p.heard(ctx, key, err)
	switch {
	case err != nil:
		return p.fail(ctx, key, redlease.ErrUnavailable, err)
	case v != 1:
		return redlease.ErrNotHeld
	}
	return nil
}

// undoFailed undoes what a failed acquisition under token may have
// written: in the background (undoLater, returning at wait's end if wait
// is not nil), or, with a fused script f, by f.Undo before it returns,
// bounded by a tenth of ttl (the Locker's default loss margin) past ctx's
// end: best effort, and the key expires on its own.
func (p *Primary) undoFailed(ctx, wait context.Context, f fused.Script, key, token string, ttl time.Duration) {
	if f == nil {
		p.undoLater(wait, key, token)
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl/redlease.DefaultLossMarginDivisor)
	defer cancel()
	f.Undo(uctx, key, token)
}

// undoLater deletes, in the background, what a failed attempt under
// token wrote (its key, by token), and leaves the waiter's entry in the
// line: the waiter still waits. The clean-up waits at most UndoBound and
// ends at Close, which waits for it (at most CloseWait); after Close none
// is started: the key expires at its TTL. With wait not nil, undoLater
// returns when the clean-up ends or wait is done, whichever comes first.
func (p *Primary) undoLater(wait context.Context, key, token string) {
	p.undoMu.Lock()
	if p.closed {
		p.undoMu.Unlock()
		return
	}
	done := make(chan struct{})
	p.undos.Go(func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(p.life, UndoBound)
		defer cancel()
		line := script.UndoArgs(key, token)
		// Bounded by ctx whatever the client: Close ends it at once.
		_, _ = bounded.Call(ctx, true, func(ctx context.Context) (int64, error) { return script.Release.Run(ctx, p.client, line) }, nil)
	})
	p.undoMu.Unlock()
	if wait != nil {
		select {
		case <-done:
		case <-wait.Done():
		}
	}
}

// Watch subscribes to releases of key on the primary (see
// redlease.Waker), waiting at most WatchBound or ctx for the confirmation.
func (p *Primary) Watch(ctx context.Context, key, waiter string) (<-chan struct{}, func(bool), error) {
	if key == "" {
		return nil, nil, redlease.Invalid("empty key")
	}
	return p.wake.Watch(ctx, script.Channel(key), waiter, 1, WatchBound)
}

// Listen subscribes waiter to releases of key without I/O if the process
// already hears them (see redlease.Waker).
func (p *Primary) Listen(ctx context.Context, key, waiter string) (<-chan struct{}, func(bool), bool) {
	if key == "" || wake.Idle() { // nothing heard: no channel name to build
		return nil, nil, false
	}
	return p.wake.Listen(ctx, script.Channel(key), waiter, 1)
}

// Placement is "failover " and the Sentinel master name when the config
// names one (Config.Master), else "primary " and the client's address
// (see redlease.Placer).
func (p *Primary) Placement() string {
	if p.cfg.Master != "" {
		return "failover " + p.cfg.Master
	}
	return "primary " + p.addr
}

// Master is the Sentinel master name of the config (Config.Master), or "".
func (p *Primary) Master() string { return p.cfg.Master }

// Fencing reports whether grants carry fences (see redlease.Fencer).
func (p *Primary) Fencing() bool { return p.cfg.Fencing }

// Close ends the subscriptions of waiters on this primary (they fall back
// to polling) and waits, at most CloseWait, for the shared subscription
// connection to stop if nobody else in the process uses it. It ends the
// clean-ups of failed acquisitions still running (see undoLater), whose
// requests in flight, through a client that ignores contexts, finish at
// the client's own timeouts. Calls other than Watch still work; a failed
// acquisition after Close is not cleaned up (its key expires at its TTL).
func (p *Primary) Close() error {
	p.undoMu.Lock()
	p.closed = true
	p.undoMu.Unlock()
	p.endLife()
	var wg sync.WaitGroup
	wg.Go(func() { p.wake.Close(CloseWait) })
	wg.Go(p.undos.Wait) // each ends at once: its ctx ended
	wg.Wait()
	return nil
}

// run sends one script call on key, followed by WAIT when replicas are
// required (on a Cluster client, on key's master: see onMaster). A reply
// that too few replicas acknowledged comes back with its value and an
// error that errors.Is ErrNotReplicated.
func (p *Primary) run(ctx context.Context, sc *script.Script, key string, line []any) (int64, error) {
	if !p.waits() {
		return sc.Run(ctx, p.client, line)
	}
	cmd, repl, err := p.runWaited(ctx, sc, key, line)
	if err != nil {
		return 0, err
	}
	v, err := cmd.Int64()
	if err != nil {
		return 0, err
	}
	return v, repl
}

// runInts is run for a script whose reply is an array of integers.
func (p *Primary) runInts(ctx context.Context, sc *script.Script, key string, line []any) ([]int64, error) {
	if !p.waits() {
		return sc.RunInts(ctx, p.client, line)
	}
	cmd, repl, err := p.runWaited(ctx, sc, key, line)
	if err != nil {
		return nil, err
	}
	v, err := cmd.Int64Slice()
	if err != nil {
		return nil, err
	}
	return v, repl
}

// runWaited sends line, a call of sc on key, followed by WAIT in one
// pipeline (on a Cluster client, to key's master: onMaster), loading sc
// once if the server did not know it. It returns the script's command
// with its reply, and repl, an error that errors.Is ErrNotReplicated if
// too few replicas acknowledged; err is the command's own error.
func (p *Primary) runWaited(ctx context.Context, sc *script.Script, key string, line []any) (cmd *redis.Cmd, repl, err error) {
	if p.cluster != nil {
		return p.onMaster(ctx, sc, key, line)
	}
	for attempt := 0; ; attempt++ {
		pipe := p.client.Pipeline()
		cmd = pipe.Do(ctx, line...)
		wait := pipe.Do(ctx, "WAIT", p.cfg.Replicas, p.cfg.WaitTimeout.Milliseconds())
		_, execErr := pipe.Exec(ctx) // errors are read per command
		if cmd.Err() == nil && cmd.Val() == nil && execErr != nil {
			// The pipeline failed before the command had a reply (a
			// connection go-redis could not set up: a refused dial,
			// WRONGPASS): the command itself carries no error.
			return nil, nil, execErr
		}
		err := cmd.Err()
		if script.IsNoScript(err) && attempt == 0 {
			if err := sc.Load(ctx, p.client); err != nil {
				return nil, nil, err
			}
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		return cmd, p.replicatedN(wait, p.cfg.Replicas), nil
	}
}

// replicatedN checks a WAIT reply against the n replicas required.
func (p *Primary) replicatedN(wait *redis.Cmd, n int) error {
	acked, err := wait.Int64()
	if err != nil {
		return fmt.Errorf("%w: WAIT failed: %w", ErrNotReplicated, err)
	}
	if int(acked) < n {
		return fmt.Errorf("%w: %d of %d replicas acknowledged within %v", ErrNotReplicated, acked, n, p.cfg.WaitTimeout)
	}
	return nil
}

// check rejects what Acquire and Extend would reject before sending
// anything (script.Check with the configured drift factor).
func (p *Primary) check(key, token string, ttl time.Duration) error {
	return script.Check(key, token, ttl, p.cfg.DriftFactor)
}

// DriftAllowance is the clock-drift allowance of a grant for ttl (see
// redlease.DriftAllowancer): ttl × the configured drift factor + 2 ms.
// Every grant's Until is its call's start plus ttl less this.
func (p *Primary) DriftAllowance(ttl time.Duration) time.Duration {
	return drift.Allowance(ttl, p.cfg.DriftFactor)
}

// ErrAcquireUnavailable is the sentinel of an acquisition that a node
// failure or an unacknowledged write decided (see failAt): an outage, which
// matches redlease.ErrUnavailable and not ErrNotObtained (nobody said
// "held"), with a message that says what was not done.
var ErrAcquireUnavailable error = acquireUnavailable{}

type acquireUnavailable struct{}

func (acquireUnavailable) Error() string {
	return "redlease: lock not taken: too few nodes answered"
}

func (acquireUnavailable) Unwrap() error { return redlease.ErrUnavailable }

// fail wraps a node failure of a call on key under sentinel, naming the
// node that serves key (addrOf), and reports it to ctx's observer.
func (p *Primary) fail(ctx context.Context, key string, sentinel, err error) error {
	p.reloadOnSilence(err)
	return failAt(ctx, p.addrOf(ctx, key), sentinel, err)
}

// addrOf names the node that serves key: the client's address, or on a
// Cluster client the master its topology names for key (the client's
// seed addresses if it names none).
func (p *Primary) addrOf(ctx context.Context, key string) string {
	if p.cluster != nil && key != "" {
		if m, err := p.cluster.MasterForKey(ctx, key); err == nil {
			return m.Options().Addr
		}
	}
	return p.addr
}

// failAt is fail naming addr as the node: one master of a Cluster client
// (in ExtendBatch). sentinel is ErrAcquireUnavailable for an
// acquisition, redlease.ErrUnavailable otherwise; a node that denied the
// client (nodes.Denied) fails with redlease.ErrDenied instead, whatever
// the operation.
func failAt(ctx context.Context, addr string, sentinel, err error) error {
	ne := &redlease.NodeError{Node: 0, Addr: addr, Err: err}
	redlease.ReportNodeFailure(ctx, ne)
	if nodes.Denied(err) {
		sentinel = redlease.ErrDenied
	}
	return redlease.Wrap(sentinel, ne)
}

// The settings single and failover share, checked in one place; each
// package wraps them in its own Option type.

// NoFencing turns fencing off.
func NoFencing(c *Config) error {
	c.Fencing = false
	return nil
}

// DriftFactor sets the drift factor, which must be in [0, 1).
func DriftFactor(factor float64) func(*Config) error {
	return func(c *Config) error {
		if err := drift.CheckFactor(factor); err != nil {
			return err
		}
		c.DriftFactor = factor
		return nil
	}
}

// FenceTTL makes fence counters expire d after their last grant instead
// of the default (script.FenceTTL).
func FenceTTL(d time.Duration) func(*Config) error {
	return func(c *Config) error {
		if d < time.Millisecond {
			return redlease.Invalid("fence TTL %v: must be at least 1ms", d)
		}
		c.FenceTTL = d
		return nil
	}
}

// UseClock sets the clock validity is judged by.
func UseClock(clock redlease.Clock) func(*Config) error {
	return func(c *Config) error {
		if clock == nil {
			return redlease.Invalid("nil clock")
		}
		c.Clock = clock
		return nil
	}
}
