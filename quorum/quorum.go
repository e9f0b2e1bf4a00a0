package quorum

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/drift"
	"github.com/redlease/redlease/internal/fanout"
	"github.com/redlease/redlease/internal/nodes"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/internal/wake"
)

// Strategy is the Redlock algorithm over N independent Redis nodes. It is
// safe for concurrent use. It does not own the node clients: closing them is
// the caller's job, after Close.
type Strategy struct {
	nodes       []redis.UniversalClient
	addrs       []string
	quorum      int
	driftFactor float64
	nodeTimeout time.Duration
	fencing     bool
	// Which entries are one server (same run_id), learnt at first contact
	// (identify): dup[i] = j means node i is node j's server, and its
	// answers count for nothing. identified: every node answered once.
	idMu       sync.Mutex
	ids        []int64
	idTried    time.Time // the last identification round, for its rate limit
	dup        atomic.Pointer[[]int]
	identified atomic.Bool
	workers    int
	maxTTL     time.Duration // delayed-restart rule; 0: off
	maxTTLArg  any           // maxTTL in ms, boxed once for the script
	durable    bool          // WithDurableNodes
	durableArg any           // script.Durable or NotDurable, boxed once
	fenceTTL   time.Duration // WithFenceTTL; 0: script.FenceTTL's default
	clock      redlease.Clock

	fan  *fanout.Nodes // per-node workers; Close stops them
	wake *wake.Set     // release notices for waiters; Close ends them
}

var (
	_ redlease.Strategy        = (*Strategy)(nil)
	_ redlease.Waker           = (*Strategy)(nil)
	_ redlease.DriftAllowancer = (*Strategy)(nil)
	_ redlease.Fencer          = (*Strategy)(nil)
	_ redlease.Placer          = (*Strategy)(nil)
	_ redlease.CallBounder     = (*Strategy)(nil)
	_ redlease.Namer           = (*Strategy)(nil)
)

// New returns a Strategy over nodes, which must be independent Redis
// primaries (not replicas of each other, not shards of one cluster). The
// slice is copied. An odd number of nodes is best: four nodes tolerate one
// failure, like three, at a higher cost.
//
// One server listed twice would vote twice: New refuses the same client or
// the same address twice (ErrInvalid), and at first contact the strategy
// asks every node for its run_id, so that two addresses of one server (a
// DNS alias, a forwarder) count once; the error of an acquisition that
// needed such a vote says so.
func New(nodeClients []redis.UniversalClient, opts ...Option) (*Strategy, error) {
	if len(nodeClients) == 0 {
		return nil, redlease.Invalid("quorum: no nodes")
	}
	s := &Strategy{
		nodes:       make([]redis.UniversalClient, len(nodeClients)),
		addrs:       make([]string, len(nodeClients)),
		quorum:      len(nodeClients)/2 + 1,
		driftFactor: DefaultDriftFactor,
		nodeTimeout: DefaultNodeTimeout,
		workers:     DefaultWorkersPerNode,
		clock:       redlease.SystemClock(),
		fencing:     true,
	}
	for i, c := range nodeClients {
		if nodes.IsNil(c) {
			return nil, redlease.Invalid("quorum: node %d is nil", i)
		}
		s.nodes[i] = c
		s.addrs[i] = nodes.Addr(c)
		for j := range i {
			// Two entries for one server would let it vote twice: a
			// "majority" of it alone. The same client, or the same address.
			if sameClient(s.nodes[j], c) || (s.addrs[i] != "" && s.addrs[j] == s.addrs[i]) {
				return nil, redlease.Invalid("quorum: nodes %d and %d are the same server (%s): each node must be an independent Redis primary", j, i, s.addrs[i])
			}
		}
	}
	s.ids = make([]int64, len(nodeClients))
	dup := make([]int, len(nodeClients))
	for i := range dup {
		dup[i] = -1
	}
	s.dup.Store(&dup)
	for _, c := range s.nodes {
		if _, ok := c.(*redis.ClusterClient); ok {
			s.identified.Store(true) // a script without keys lands on any master: no identity to learn
		}
	}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(s); err != nil {
			return nil, err
		}
	}
	s.maxTTLArg, s.durableArg = any(script.RuleOff), any(script.NotDurable)
	if s.durable {
		if s.maxTTL == 0 {
			return nil, redlease.Invalid("quorum: WithDurableNodes qualifies the delayed-restart rule; give WithDelayedRestart too")
		}
		s.durableArg = any(script.Durable)
	}
	if s.maxTTL > 0 {
		s.maxTTLArg = any(strconv.FormatInt(s.maxTTL.Milliseconds(), 10))
		for i, c := range s.nodes {
			if _, ok := c.(*redis.ClusterClient); ok {
				return nil, redlease.Invalid("quorum: node %d is a Cluster client; the delayed-restart rule needs one boot marker per node", i)
			}
		}
	}
	for i, c := range s.nodes {
		if c, ok := c.(*redis.Client); ok && s.workers >= c.Options().PoolSize {
			return nil, redlease.Invalid("quorum: %d workers per node would hold all %d pooled connections of node %d; lower WithWorkersPerNode or raise PoolSize",
				s.workers, c.Options().PoolSize, i)
		}
	}
	s.fan = fanout.New(s.nodes, s.workers, s.nodeTimeout)
	s.wake = wake.NewSet(s.nodes...)
	// Every failed request reaches the operation's observer, even one that
	// fails after the round was decided.
	s.fan.OnFailure = func(ctx context.Context, node int, err error) {
		redlease.ReportNodeFailure(ctx, s.nodeError(node, err))
	}
	return s, nil
}

// Quorum returns how many nodes must agree for a grant.
func (s *Strategy) Quorum() int { return s.quorum }

// Placement names the strategy's nodes: "quorum " and their addresses,
// sorted and comma-separated (see redlease.Placer).
func (s *Strategy) Placement() string {
	addrs := slices.Clone(s.addrs)
	slices.Sort(addrs)
	return "quorum " + strings.Join(addrs, ",")
}

// Fencing reports whether grants carry fences: true unless built
// WithoutFencing (see redlease.Fencer).
func (s *Strategy) Fencing() bool { return s.fencing }

// Name returns "quorum", for observers (see redlease.Namer).
func (s *Strategy) Name() string { return "quorum" }

// Close ends the release subscriptions of the strategy's waiters (they
// fall back to polling) and stops its per-node workers after their current
// request, waiting for both at once, and returns within two node timeouts.
// What a hung node holds past that is left to end on its own: a worker
// whose request is held through a client without ContextTimeoutEnabled
// (go-redis then waits for its ReadTimeout and retries) ends when that
// request returns, at the client's own timeouts or when the client is
// closed; a subscription connection being dialed to a hung node (the node
// paused before a waiter came, say) ends when go-redis's dial gives up, at
// the client's DialTimeout and ReadTimeout, whatever ContextTimeoutEnabled
// says. Calls after Close fail: an acquisition with ErrInvalid, at once
// (Locker.Lock and Do do not retry it), others with ErrUnavailable. It
// does not close the node clients.
func (s *Strategy) Close() error {
	var wg sync.WaitGroup
	wg.Go(func() { s.wake.Close(2 * s.nodeTimeout) })
	s.fan.Close()
	wg.Wait()
	return nil
}

// Watch subscribes to releases of key on every node, so that a waiting
// Locker.Lock tries again as soon as the holder lets go (see
// redlease.Waker): a notice from any node triggers an attempt, which
// still needs its quorum. It returns once enough nodes confirmed that
// every quorum includes one of them (len(nodes) − quorum + 1: a release
// reaches every node of the holder's quorum), or every node answered, or
// the node timeout or ctx passed. All waiters of the process share one
// subscription connection per node.
func (s *Strategy) Watch(ctx context.Context, key, waiter string) (<-chan struct{}, func(bool), error) {
	if key == "" {
		return nil, nil, redlease.Invalid("empty key")
	}
	return s.wake.Watch(ctx, script.Channel(key), waiter, len(s.nodes)-s.quorum+1, s.nodeTimeout)
}

// Listen subscribes waiter to releases of key without I/O if enough nodes
// (as for Watch) already carry the process's confirmed subscription to
// them (see redlease.Waker).
func (s *Strategy) Listen(ctx context.Context, key, waiter string) (<-chan struct{}, func(bool), bool) {
	if key == "" {
		return nil, nil, false
	}
	return s.wake.Listen(ctx, script.Channel(key), waiter, len(s.nodes)-s.quorum+1)
}

// Acquire makes one attempt to take key on a quorum of the nodes:
//
//  1. Note the monotonic start time, then send the acquire script to every
//     node at once, each bounded by the node timeout. An acquisition whose
//     ctx ended, or reached its deadline, before this step (the first
//     acquisition of a Strategy identifies the nodes first: see New) sends
//     nothing and fails as a round that no node answered in time does.
//  2. Count replies as they arrive; stop as soon as a quorum granted, or as
//     soon as a quorum is out of reach, or at the node timeout.
//     A node that finds its own token already there (a retried request whose
//     reply was lost) counts as a grant.
//  3. With fencing, the fence is the highest counter the grants replied
//     (each granting node increments its counter); if fewer than a quorum
//     replied it, a second round raises the nodes to it, confirmed by a
//     quorum that replied it or still holds our token.
//  4. Validity = ttl − elapsed − (ttl×driftFactor + 2 ms), i.e. the grant is
//     good Until start + ttl − allowance; none left is a failure.
//  5. On failure, release on every node, each only after its own acquire
//     request has returned, so a late write cannot leave a key behind.
func (s *Strategy) Acquire(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	return s.acquire(ctx, key, token, ttl, nil)
}

// acquire is Acquire, in fair mode (fair.go) when place is not nil.
func (s *Strategy) acquire(ctx context.Context, key, token string, ttl time.Duration, place *redlease.Place) (redlease.Grant, error) {
	if err := script.Check(key, token, ttl, s.driftFactor); err != nil {
		return redlease.Grant{}, err
	}
	if err := s.checkTTL(ttl); err != nil {
		return redlease.Grant{}, err
	}
	if err := s.checkFenceTTL(ttl); err != nil {
		return redlease.Grant{}, err
	}
	if err := ctx.Err(); err != nil {
		return redlease.Grant{}, redlease.Wrap(redlease.ErrNotObtained, context.Cause(ctx))
	}
	if s.fan.Closed() {
		// Not an outage: no retry would reach a node.
		return redlease.Grant{}, redlease.Invalid("quorum: acquisition after Close")
	}
	s.identify(ctx)
	if ended(ctx, s.nodeTimeout) {
		// The caller's deadline came while identify waited for the nodes,
		// or comes at this instant: a round started now would only be
		// undone, and whether a worker sent its request before the round
		// failed would be the scheduler's. Nothing is sent; the error is
		// the one a round that no node answered before ctx ended gives.
		err := s.failure(ctx, "acquire", redlease.ErrNotObtained, tally{}, s.clock.Now(), false)
		if ctx.Err() == nil { // its deadline passed, and it did not end within bound
			err = redlease.Wrap(err, context.DeadlineExceeded)
		}
		return redlease.Grant{}, err
	}
	k := any(key) // boxed once, passed for every key the script does not touch
	mode, fenceKey, marker := any(script.NoFence), k, k
	if s.fencing {
		mode, fenceKey = any(script.QuorumFence), any(script.MustFenceKey(key))
	}
	if s.maxTTL > 0 {
		marker = any(script.BootMarker)
	}
	queue := k // KEYS[4], the line: read only in fair mode
	if place != nil {
		queue = any(script.QueueKey(key))
	}
	fenceTTL := script.FenceTTL(s.fenceTTL, ttl)
	line := script.Acquire.Args(k, fenceKey, marker, queue, token, ttl.Milliseconds(), mode, s.maxTTLArg, s.durableArg, fenceTTL)
	if place != nil {
		line = script.AppendPlace(line, *place)
	}

	// 1. Fan out.
	start := s.clock.Now()
	round := s.fan.Start(ctx, fanout.Call{Script: script.Acquire, Line: line},
		// The undo's line is built only if an undo is sent.
		fanout.Call{Script: script.Release, Build: script.UndoArgs, Key: key, Token: line[7], // token already boxed
			Skip: skipUndo})

	// 2. Count until the outcome is decided.
	t := s.collect(ctx, round, grantedByAcquire)
	fail := func(op string, report tally, expired bool) (redlease.Grant, error) {
		round.Decide(true)
		// Wait for the nodes known to hold our key, at most a node
		// timeout and never past ctx's end; nodes that failed or have not
		// answered, and those the wait gave up on, are undone in the
		// background.
		round.WaitUndone(ctx, t.agreedBy, s.nodeTimeout)
		round.Done()
		return redlease.Grant{}, s.failure(ctx, op, redlease.ErrNotObtained, report, start, expired)
	}
	if t.agreed < s.quorum {
		if t.queued > 0 {
			t.causes = append(t.causes, redlease.ErrQueued)
		}
		return fail("acquire", t, false)
	}

	// 3. Fencing: the fence is the highest counter the grants replied;
	// where fewer than a quorum replied it, raise the nodes to it.
	var fence uint64
	if s.fencing {
		fence = uint64(t.highest)
		if at, n := s.atFence(round, t); n < s.quorum {
			if ft := s.raiseFence(ctx, line[3], line[4], line[7], fence, fenceTTL, at); ft.agreed < s.quorum {
				return fail("acquire (fence phase)", ft, false)
			}
		}
	}

	// 4. Validity.
	until := start.Add(ttl - s.DriftAllowance(ttl))
	if !s.clock.Now().Before(until) {
		return fail("acquire", t, true)
	}
	round.Keep(key, token)
	round.Done()
	return redlease.Grant{Until: until, Fence: fence}, nil
}

// ended reports whether ctx has ended or its deadline has passed. At the
// deadline's instant, before ctx's own timer has ended it, it waits for
// that, at most bound (a context whose deadline passes without ending it
// is not held longer than a round would hold it), so that ctx.Err is set
// when it reports true, as it is after a round that ctx ended.
func ended(ctx context.Context, bound time.Duration) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	if !ok || time.Now().Before(dl) {
		return false
	}
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return true
}

// checkTTL applies the delayed-restart rule's bound to every TTL that
// reaches a node: a node that restarts empty sits out maxTTL, which covers
// only locks that never live longer than that, however they got there
// (acquired or extended).
func (s *Strategy) checkTTL(ttl time.Duration) error {
	if s.maxTTL > 0 && ttl > s.maxTTL {
		return redlease.Invalid("ttl %v exceeds the delayed-restart max TTL %v", ttl, s.maxTTL)
	}
	return nil
}

// checkFenceTTL refuses an acquisition with a TTL longer than the fence
// counter TTL given (WithFenceTTL).
func (s *Strategy) checkFenceTTL(ttl time.Duration) error {
	if s.fencing && s.fenceTTL > 0 && ttl > s.fenceTTL {
		return redlease.Invalid("ttl %v: longer than the fence counter TTL %v (WithFenceTTL), which must be at least every TTL acquired with", ttl, s.fenceTTL)
	}
	return nil
}

// atFence returns the servers (bit i: node i's server, see identify) whose
// grant in the acquire round t counted replied the fence, t.highest, and
// how many they are. Each holds, from a moment our key was there, a
// counter of at least the fence with its TTL refreshed: what raiseFence
// establishes elsewhere. With more than 64 nodes it returns none, so that
// raiseFence asks every node.
func (s *Strategy) atFence(round *fanout.Round, t tally) (servers uint64, n int) {
	if len(s.nodes) > 64 {
		return 0, 0
	}
	dup := *s.dup.Load()
	for i := range s.nodes {
		if t.agreeing&(1<<i) == 0 || round.Result(i).Val != t.highest {
			continue
		}
		server := i
		if dup[i] >= 0 {
			server = dup[i]
		}
		if servers&(1<<server) == 0 {
			servers |= 1 << server
			n++
		}
	}
	return servers, n
}

// raiseFence is the fence's second round, for an acquisition whose grants
// did not reply the fence on a quorum: it raises every node's counter to
// at least fence and counts the nodes that still hold our token, beside
// the servers at (atFence) that hold the fence already. Why this makes
// fences rise across holders is in the package documentation.
func (s *Strategy) raiseFence(ctx context.Context, key, fenceKey, token any, fence uint64, fenceTTL any, at uint64) tally {
	line := script.RaiseFence.Args(key, fenceKey, token, strconv.FormatUint(fence, 10), fenceTTL)
	round := s.fan.Start(ctx, fanout.Call{Script: script.RaiseFence, Line: line}, fanout.Call{})
	t := s.collectFrom(ctx, round, isOne, at)
	round.Done()
	return t
}

// Extend raises key's TTL to ttl on every node that still holds token (a
// node never shortens it: see redlease.Strategy), in parallel, and
// succeeds once a quorum did so with validity left. A partial
// extension is not undone: those keys are ours and expire on their own.
func (s *Strategy) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	if err := script.Check(key, token, ttl, s.driftFactor); err != nil {
		return redlease.Grant{}, err
	}
	if err := s.checkTTL(ttl); err != nil {
		return redlease.Grant{}, err
	}
	line := script.Extend.Args(key, token, ttl.Milliseconds())
	start := s.clock.Now()
	round := s.fan.Start(ctx, fanout.Call{Script: script.Extend, Line: line}, fanout.Call{})
	t := s.collect(ctx, round, isOne)
	round.Done()
	if t.agreed < s.quorum {
		return redlease.Grant{}, s.failure(ctx, "extend", s.heldOrUnknown(t), t, start, false)
	}
	until := start.Add(ttl - s.DriftAllowance(ttl))
	if !s.clock.Now().Before(until) {
		return redlease.Grant{}, s.failure(ctx, "extend", redlease.ErrNotHeld, t, start, true)
	}
	return redlease.Grant{Until: until}, nil
}

// Release deletes key on every node that still holds token, in parallel. It
// returns once a quorum confirmed the delete, or once too many nodes did
// not hold the key for a quorum to have held it, or at the node timeout; stragglers finish in the
// background, unaffected by ctx's cancellation, within the node timeout.
// Until they land, those nodes may refuse an acquisition of key (see the
// package documentation).
func (s *Strategy) Release(ctx context.Context, key, token string) error {
	if key == "" {
		return redlease.Invalid("empty key")
	}
	line := script.ReleaseArgs(key, token)
	start := s.clock.Now()
	callCtx := ctx
	if ctx.Done() != nil {
		callCtx = context.WithoutCancel(ctx) // stragglers finish even if ctx is cancelled
	}
	// A request of the acquisition still in flight (a slow node, a retry
	// across a healed partition) could write the key after this release
	// deleted it, and block the next holder on that node until the TTL:
	// on such a node the release is sent once that request has finished.
	round := s.fan.StartAfter(callCtx, fanout.Call{Script: script.Release, Line: line}, key, token)
	t := s.collect(ctx, round, isOne)
	round.Done()
	if t.agreed >= s.quorum {
		return nil
	}
	return s.failure(ctx, "release", s.heldOrUnknown(t), t, start, false)
}

// tally is what one round of requests came to.
type tally struct {
	agreed   int   // replies that agreed (granted, extended, released, confirmed)
	refused  int   // replies that definitely did not (taken, not ours)
	queued   int   // refusals of a free key for a waiter not at the head of its line (fair mode)
	answered int   // replies of any kind, errors included
	highest  int64 // highest value among agreeing replies (fence counters)
	// remaining: the longest holder's TTL among refusals that carried one
	// (acquire; see QuorumError.Remaining)
	remaining time.Duration
	causes    []error
	agreeing  uint64 // bit i: node i agreed (nodes 64 and up are not tracked)
}

// agreedBy reports whether node i agreed; for i >= 64 it answers true, so
// callers err on the side of waiting.
func (t tally) agreedBy(i int) bool {
	return i >= 64 || t.agreeing&(1<<i) != 0
}

// skipUndo names the acquire replies that wrote nothing to undo: the key
// was someone else's, or the node did not vote.
func skipUndo(r fanout.Result) bool { return script.IsTaken(r.Val) || r.Val == script.TooYoung }

// isOne is the agreement test of the scripts that answer 1 or 0.
func isOne(v int64) (bool, error) { return v == 1, nil }

// grantedByAcquire is the agreement test of the acquire script: anything
// but Taken and TooYoung is a grant (the value is the fence counter).
func grantedByAcquire(v int64) (bool, error) {
	switch {
	case script.IsTaken(v):
		return false, nil
	case v == script.TooYoung:
		return false, errTooYoung
	}
	return true, nil
}

// errTooYoung is the cause recorded for a node that refused to vote under
// the delayed-restart rule.
var errTooYoung = errors.New("node lost its data less than the delayed-restart max TTL ago: not voting yet")

// collect counts replies as they arrive until a quorum agreed, a quorum
// became impossible, the round's deadline passed (every silent node then
// gets a timeout cause), or ctx was done.
func (s *Strategy) collect(ctx context.Context, round *fanout.Round, agree func(int64) (bool, error)) tally {
	return s.collectFrom(ctx, round, agree, 0)
}

// collectFrom is collect with the servers in agreed (bit i: server i)
// counted as agreeing from the start; their replies change nothing.
func (s *Strategy) collectFrom(ctx context.Context, round *fanout.Round, agree func(int64) (bool, error), agreed uint64) tally {
	var (
		t       tally
		small   [16]bool // which nodes replied; on the stack for up to 16 nodes
		replied = small[:0]
	)
	if len(s.nodes) <= len(small) {
		replied = small[:len(s.nodes)]
	} else {
		replied = make([]bool, len(s.nodes))
	}
	// Votes count per server: an entry that is another's server (dup, by
	// run_id) speaks for that server. Its request acts on the same data,
	// so either entry's "yes" is the server's (a release's delete may land
	// through either address, and the other then finds the key gone); a
	// server counts once, and a "yes" outweighs a "no".
	dup := *s.dup.Load()
	var (
		smallVotes [16]int8 // per server: 0 none, 1 refused, 2 agreed
		votes      = smallVotes[:0]
	)
	if len(s.nodes) <= len(smallVotes) {
		votes = smallVotes[:len(s.nodes)]
	} else {
		votes = make([]int8, len(s.nodes))
	}
	// open: the nodes whose reply may still add a vote.
	open := len(s.nodes)
	serverOf := func(node int) int {
		if dup[node] >= 0 {
			return dup[node]
		}
		return node
	}
	if agreed != 0 {
		for i := range s.nodes {
			sv := serverOf(i)
			if agreed&(1<<sv) == 0 {
				continue
			}
			open--
			if votes[sv] == 0 {
				votes[sv] = 2
				t.agreed++
			}
		}
	}
	record := func(node int) {
		r := round.Result(node)
		t.answered++
		replied[node] = true
		server := serverOf(node)
		if agreed&(1<<server) != 0 { // counted already
			if r.Err != nil {
				t.causes = append(t.causes, s.nodeError(node, r.Err))
			}
			return
		}
		open--
		if r.Err != nil {
			t.causes = append(t.causes, s.nodeError(node, r.Err))
			return
		}
		ok, why := agree(r.Val)
		if r.Val == script.Queued {
			t.queued++
		}
		if d, held := script.Remaining(r.Val); held && !ok { // only acquire replies are that low
			t.remaining = max(t.remaining, d)
		}
		switch {
		case ok:
			t.highest = max(t.highest, r.Val)
			if node < 64 {
				t.agreeing |= 1 << node
			}
			switch votes[server] {
			case 2: // this server said yes already, through its other address
				t.causes = append(t.causes, s.nodeError(node, errSameServer{of: server}))
				return
			case 1:
				t.refused--
			}
			votes[server] = 2
			t.agreed++
		default:
			if why != nil {
				t.causes = append(t.causes, s.nodeError(node, why))
			}
			if votes[server] == 0 {
				votes[server] = 1
				t.refused++
			} else if dup[node] >= 0 {
				t.causes = append(t.causes, s.nodeError(node, errSameServer{of: server}))
			}
		}
	}
	decided := func() bool {
		return t.agreed >= s.quorum || open+t.agreed < s.quorum
	}
	if await(ctx, round, decided, record) {
		t.causes = s.silent(t.causes, replied)
	}
	return t
}

// await feeds replies to record until decided says so, ctx is done, or the
// round's deadline passes; replies that arrived together with the deadline
// still count. It reports whether the deadline left the round undecided
// (the nodes that did not reply then count as timed out).
func await(ctx context.Context, round *fanout.Round, decided func() bool, record func(node int)) (silent bool) {
	for !decided() {
		select {
		case i := <-round.Arrived():
			record(i)
		case <-round.Expired():
			for more := true; more && !decided(); {
				select {
				case i := <-round.Arrived():
					record(i)
				default:
					more = false
				}
			}
			return !decided() && ctx.Err() == nil
		case <-ctx.Done(): // the requests run on; the caller stops waiting
			return false
		}
	}
	return false
}

// silent adds a timeout cause for every node that has not replied.
func (s *Strategy) silent(causes []error, replied []bool) []error {
	for i, ok := range replied {
		if !ok {
			causes = append(causes, s.nodeError(i, errNoReply{s.nodeTimeout}))
		}
	}
	return causes
}

// heldOrUnknown picks the sentinel of an extend or release that fell short:
// ErrNotHeld when the nodes that said "not ours" alone rule a quorum out,
// ErrUnavailable when failures or silence left it open.
func (s *Strategy) heldOrUnknown(t tally) error {
	if len(s.nodes)-t.refused < s.quorum {
		return redlease.ErrNotHeld
	}
	return redlease.ErrUnavailable
}

// failure builds the error of a round that fell short of a quorum; if ctx
// ended the round, ctx's error is reachable with errors.Is too. Down is
// not held: an acquisition that refusals alone did not rule out fails
// with ErrUnavailable (QuorumError.Unavailable), not ErrNotObtained. A
// round that failures decided (ErrUnavailable) and whose denials alone
// (nodes.Denied: NOPERM, NOAUTH, WRONGPASS) rule the quorum out fails
// with ErrDenied: a configuration error, not an outage.
func (s *Strategy) failure(ctx context.Context, op string, sentinel error, t tally, start time.Time, expired bool) error {
	causes := byNode(t.causes)
	down := sentinel == redlease.ErrNotObtained && !expired && len(s.nodes)-t.refused >= s.quorum
	switch {
	case (down || sentinel == redlease.ErrUnavailable) && len(s.nodes)-denials(causes) < s.quorum:
		sentinel, down = redlease.ErrDenied, false
	case down:
		sentinel = redlease.ErrUnavailable
	}
	qe := &redlease.QuorumError{
		Action: op, Votes: t.agreed, Quorum: s.quorum, Nodes: len(s.nodes),
		Elapsed: s.clock.Now().Sub(start), Expired: expired, Err: sentinel,
		Causes:      causes,
		Remaining:   t.remaining,
		Unavailable: down,
	}
	if ctx.Err() != nil {
		return redlease.Wrap(qe, context.Cause(ctx))
	}
	return qe
}

// denials counts the nodes among causes that denied the client
// (nodes.Denied).
func denials(causes []error) int {
	seen := map[int]bool{}
	for _, c := range causes {
		if ne, ok := c.(*redlease.NodeError); ok && nodes.Denied(ne.Err) {
			seen[ne.Node] = true
		}
	}
	return len(seen)
}

// errNoReply is the cause recorded for a node that did not answer within
// the node timeout. It matches context.DeadlineExceeded with errors.Is.
type errNoReply struct{ timeout time.Duration }

// Error says which timeout passed.
func (e errNoReply) Error() string {
	return "no reply within the node timeout of " + e.timeout.String()
}

// Is makes errors.Is(err, context.DeadlineExceeded) true.
func (e errNoReply) Is(target error) bool { return target == context.DeadlineExceeded }

// byNode returns a copy of causes (the batch's items share one list) with
// the per-node causes in node order, after any other: failures that came
// at one instant arrive in the order their workers ran, which says
// nothing, and an error's text should not depend on it.
func byNode(causes []error) []error {
	out := slices.Clone(causes)
	node := func(err error) int {
		if ne, ok := err.(*redlease.NodeError); ok {
			return ne.Node
		}
		return -1
	}
	slices.SortStableFunc(out, func(a, b error) int { return cmp.Compare(node(a), node(b)) })
	return out
}

func (s *Strategy) nodeError(i int, err error) *redlease.NodeError {
	return &redlease.NodeError{Node: i, Addr: s.addrs[i], Err: err}
}

// sameClient reports whether a and b are one client value (== on an
// incomparable dynamic type would panic; such values are never the same).
func sameClient(a, b redis.UniversalClient) bool {
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta.Comparable() && a == b
}

// CallBound is how long one round to the nodes may take: the node timeout
// (see redlease.CallBounder). A keeper (renew.Watchdog, Do's default)
// waits at least twice that for a renewal of this strategy's locks,
// whatever its own renewal timeout, and Locker.Do waits that long for its
// release after fn (the lock's TTL if shorter).
func (s *Strategy) CallBound() time.Duration { return s.nodeTimeout }

// DriftAllowance is the clock-drift allowance of a grant for ttl (see
// redlease.DriftAllowancer): ttl × the drift factor (WithDriftFactor) +
// 2 ms. Every grant's Until is its round's start plus ttl less this.
func (s *Strategy) DriftAllowance(ttl time.Duration) time.Duration {
	return drift.Allowance(ttl, s.driftFactor)
}

// identify learns, at first contact, which entries are one server: every
// node is asked for its run_id, in one round before the first acquisition
// that waits at most a quarter of the node timeout (and again at most
// every identifyInterval until every node has answered), and a node whose
// run_id an earlier node has counts for nothing from then on (errSameServer in the error). quorum.New refuses
// the same client or address twice; this catches two addresses of one
// server (a DNS alias, a forwarder). A node that did not answer yet is
// counted as its own server until it does. Acquisitions that start while
// another asks do not wait for it.
//
// identifyInterval bounds how often a node that has not answered is asked
// again (each round may wait up to the node timeout for it).
const identifyInterval = 30 * time.Second

func (s *Strategy) identify(ctx context.Context) {
	if s.identified.Load() {
		return
	}
	if !s.idMu.TryLock() {
		return // another acquisition is asking; this one goes on
	}
	defer s.idMu.Unlock()
	if s.identified.Load() || time.Since(s.idTried) < identifyInterval {
		return
	}
	s.idTried = time.Now()
	round := s.fan.Start(ctx, fanout.Call{Script: script.Identify, Line: script.Identify.Args()}, fanout.Call{})
	// Wait a quarter of the node timeout at most: nodes that are down must
	// not double the first acquisition's time; they are asked again later.
	wctx, cancel := context.WithTimeout(ctx, s.nodeTimeout/4)
	defer cancel()
	answered := 0
	await(wctx, round, func() bool { return answered == len(s.nodes) }, func(node int) {
		answered++
		if r := round.Result(node); r.Err == nil && r.Val != 0 {
			s.ids[node] = r.Val
		}
	})
	round.Done()
	dup := slices.Clone(*s.dup.Load())
	known := 0
	for i, id := range s.ids {
		if id == 0 {
			continue
		}
		known++
		if dup[i] >= 0 {
			continue
		}
		for j := range i {
			if s.ids[j] == id {
				dup[i] = j
				break
			}
		}
	}
	s.dup.Store(&dup)
	if known == len(s.ids) {
		s.identified.Store(true)
	}
}

// errSameServer is the cause recorded for a node that is the same server
// as an earlier node of the list (same run_id): its answers count once.
type errSameServer struct{ of int }

func (e errSameServer) Error() string {
	return fmt.Sprintf("the same server as node %d (same run_id): its vote counts once; list each server once", e.of)
}
