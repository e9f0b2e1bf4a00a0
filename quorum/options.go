package quorum

import (
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/drift"
)

// Defaults, in one place.
const (
	// DefaultDriftFactor is the share of the TTL subtracted from every
	// grant's validity for clock-rate differences (plus a fixed 2 ms).
	DefaultDriftFactor = drift.DefaultFactor
	// DefaultNodeTimeout bounds each round of requests to the nodes. Keep it
	// well below the TTL: a round that takes longer than the TTL can never
	// grant.
	DefaultNodeTimeout = 100 * time.Millisecond
	// DefaultWorkersPerNode bounds the requests in flight to one node.
	DefaultWorkersPerNode = 8
)

// Option configures a Strategy in New.
type Option interface {
	apply(*Strategy) error
}

type optionFunc func(*Strategy) error

func (f optionFunc) apply(s *Strategy) error { return f(s) }

// WithDriftFactor sets the share of the TTL allowed for clock-rate
// differences between this process and the nodes: a grant's validity is
// ttl − elapsed − (ttl×factor + 2 ms). Default DefaultDriftFactor (0.01).
// Must be in [0, 1).
func WithDriftFactor(factor float64) Option {
	return optionFunc(func(s *Strategy) error {
		if err := drift.CheckFactor(factor); err != nil {
			return err
		}
		s.driftFactor = factor
		return nil
	})
}

// WithNodeTimeout bounds each round of requests (acquire, fence, extend,
// release): the round is decided from whatever answered within d, and nodes
// that did not count as failed. Default DefaultNodeTimeout (100 ms). Must be
// positive.
//
// The strategy stops waiting at d whatever the client does, but the request
// itself keeps a goroutine until go-redis gives up on it. Enable
// ContextTimeoutEnabled on the node clients so that happens at d too,
// rather than at the client's ReadTimeout.
func WithNodeTimeout(d time.Duration) Option {
	return optionFunc(func(s *Strategy) error {
		if d <= 0 {
			return redlease.Invalid("node timeout %v: must be positive", d)
		}
		s.nodeTimeout = d
		return nil
	})
}

// WithFencing turns fencing tokens on. They are on by default (the strategy
// is the one for money, and a fence is what lets storage refuse a late
// holder); the option remains so that existing code keeps compiling and
// reads as it means. See the package documentation for the design and why
// it is correct.
func WithFencing() Option {
	return optionFunc(func(s *Strategy) error {
		s.fencing = true
		return nil
	})
}

// WithoutFencing turns fencing tokens off: every grant's fence is 0, and an
// acquisition saves what fences cost: an increment in each node's acquire
// script, and a second round to the nodes where their counters parted
// (see the package documentation).
// Use it only where nothing downstream compares fences (a lock that merely
// avoids duplicate work); a holder paused past its lease can then not be
// refused by storage.
func WithoutFencing() Option {
	return optionFunc(func(s *Strategy) error {
		s.fencing = false
		return nil
	})
}

// WithQuorum sets how many nodes must agree. Default: a majority,
// len(nodes)/2+1. It must be more than half the nodes (two smaller quorums
// could both be met at once, and mutual exclusion would be gone) and at most
// all of them.
func WithQuorum(k int) Option {
	return optionFunc(func(s *Strategy) error {
		n := len(s.nodes)
		if k <= n/2 || k > n {
			return redlease.Invalid("quorum %d of %d nodes: must be more than half and at most all", k, n)
		}
		s.quorum = k
		return nil
	})
}

// WithWorkersPerNode bounds how many requests may be in flight to one node
// at a time. Default DefaultWorkersPerNode (8). Workers start as load needs
// them and stay until Close. A busy worker uses one of the node client's
// pooled connections, so for a *redis.Client n must stay below its
// PoolSize, leaving connections for the client's other users.
// One node's throughput is at most n / round-trip time; requests beyond
// what the workers take wait in a queue (up to 4096), and a request still
// queued at its round's deadline counts as a timeout for that node without
// being sent. A hung node therefore never holds more than n requests.
func WithWorkersPerNode(n int) Option {
	return optionFunc(func(s *Strategy) error {
		if n < 1 {
			return redlease.Invalid("workers per node %d: must be at least 1", n)
		}
		s.workers = n
		return nil
	})
}

// WithDelayedRestart enforces the delayed-restart rule in the client: a node
// that restarted (a new server process), or lost its data, does not vote
// until maxTTL has passed since a redlease client first saw it, so that no
// lock it forgot can still be held through the other nodes. maxTTL must be
// at least the longest TTL any client uses on these nodes; Acquire, Extend
// and ExtendBatch reject a longer ttl (an extension past maxTTL would
// outlive a restarted node's wait). Default off.
//
// It costs no extra round trip (the check is inside the acquire script; see
// the package documentation for the boot marker). Every restart counts,
// including one from an RDB snapshot or an append-only file with
// appendfsync everysec: those bring the marker back but may have lost newer
// locks. The price: after every restart, and on a fresh deployment, each
// node sits out one maxTTL — a fresh deployment grants nothing for maxTTL.
// Nodes that lose nothing on a restart (appendonly yes, appendfsync
// always) can keep their vote: see WithDurableNodes. It needs standalone
// nodes (one marker per node), not Cluster clients.
func WithDelayedRestart(maxTTL time.Duration) Option {
	return optionFunc(func(s *Strategy) error {
		if maxTTL < time.Millisecond {
			return redlease.Invalid("delayed-restart max TTL %v: must be at least 1ms", maxTTL)
		}
		s.maxTTL = maxTTL
		return nil
	})
}

// WithDurableNodes declares that every node runs appendonly yes with
// appendfsync always, so a restart loses no acknowledged write: under the
// delayed-restart rule a node that restarts with its boot marker keeps its
// vote (one that lost its data still sits out maxTTL). It needs
// WithDelayedRestart. Default off: every restart sits out.
//
// The client cannot verify the declaration; `redlease doctor --max-ttl …
// --durable` checks each node's settings. Give every client of the same
// nodes the same setting: the marker is shared, and a client without it
// makes a restarted node sit out for everyone. A node declared durable that restarts from
// an older snapshot votes at once and can grant a lock that is still held
// elsewhere.
func WithDurableNodes() Option {
	return optionFunc(func(s *Strategy) error {
		s.durable = true
		return nil
	})
}

// WithFenceTTL sets how long a lock's fence counter lives after its last
// grant: d, or the acquisition's TTL if that is longer. Default
// redlease.DefaultFenceTTL. Every counter expires; one created anew
// starts from the server's clock in microseconds, so its first fence is
// above every fence the expired one handed out (the argument and its
// assumptions: the server's clock does not step back by d across the
// expiry; the nodes' clocks differ by less than d). d must be at least
// every TTL acquired with; an Acquire with a longer TTL is refused. Give
// every client of the same keys the same setting. It applies with
// WithFencing.
func WithFenceTTL(d time.Duration) Option {
	return optionFunc(func(s *Strategy) error {
		if d < time.Millisecond {
			return redlease.Invalid("fence TTL %v: must be at least 1ms", d)
		}
		s.fenceTTL = d
		return nil
	})
}

// WithClock makes the strategy judge validity by c. Default
// redlease.SystemClock(); another Clock is for tests that emulate a clock
// running at the wrong rate (see redlease.Clock). Give the Locker the same
// clock.
func WithClock(c redlease.Clock) Option {
	return optionFunc(func(s *Strategy) error {
		if c == nil {
			return redlease.Invalid("quorum: nil clock")
		}
		s.clock = c
		return nil
	})
}
