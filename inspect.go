package redlease

import (
	"context"
	"time"
)

// Inspector is a Strategy that can say what its nodes hold for a key
// without changing anything: the token there, its remaining TTL, the fence
// counter and the waiters in the key's fair-mode line, node by node, and a
// verdict. The strategies of this module implement it; Locker.Inspect
// uses it.
//
// Inspect reads each node in one script (atomic on that node, so a node's
// view is one instant of it), asks every node at once and returns within
// the strategy's call bound (CallBounder; DefaultCallBound for single and
// failover), whatever the go-redis client's options: a node that has not
// answered by then is reported with a timeout as its Err. The views of
// different nodes are from different instants, like any reading of a
// distributed lock.
//
// It returns an error that errors.Is ErrUnavailable when fewer than a
// majority of the nodes answered (an outage is never "held"), ErrDenied
// when the nodes' denials alone left too few, ErrInvalid for a key no lock
// can have (empty, in the reserved namespace, or with '}' but no hash
// tag), and the ctx error if ctx ended first. On ErrUnavailable and
// ErrDenied the Inspection still holds every node's view, and its State is
// KeyUnavailable.
type Inspector interface {
	Inspect(ctx context.Context, key string) (Inspection, error)
}

// KeyState is an Inspection's verdict on a key.
type KeyState string

// The verdicts of an Inspection. They count nodes against a majority of
// all the strategy's nodes (one, for single and failover), as a grant
// does.
const (
	// KeyHeld: a majority of the nodes hold the key under one token.
	KeyHeld KeyState = "held"
	// KeyFree: a majority of the nodes have no such key.
	KeyFree KeyState = "free"
	// KeySplit: a majority of the nodes answered, but they show no
	// majority either way: a grant or a release under way, the remains of
	// a failed attempt, a lock that expired on some nodes before others,
	// or the nodes that did not answer holding the rest. Nobody can be
	// granted the key while too few nodes are free; whether someone holds
	// it depends on the nodes that did not answer.
	KeySplit KeyState = "split"
	// KeyUnavailable: fewer than a majority of the nodes answered, so
	// free cannot be told from held. Inspect returns ErrUnavailable (or
	// ErrDenied) with it.
	KeyUnavailable KeyState = "unavailable"
)

// Inspection is what a strategy's nodes said about one key at one moment
// (see Inspector). It is a snapshot: by the time it is read the key may
// have been released, renewed or taken again. Act on it only through
// calls that compare the token (Locker.ForceRelease does).
type Inspection struct {
	// Key is the key as the caller gave it (Locker.Inspect: without the
	// Locker's prefix).
	Key   string
	State KeyState
	// Token is the holder's token with KeyHeld; otherwise the token that
	// most answering nodes hold (the smallest of equals; a minority's:
	// the remains of an attempt or of an expiring lock), "" if none does.
	Token string
	// Holding is how many nodes hold Token, Free how many answered that
	// they have no such key, Answered how many answered at all, and
	// Quorum how many make a majority of all the strategy's nodes.
	Holding, Free, Answered, Quorum int
	// Remaining is until when the nodes keep Token's key without a
	// renewal: the longest remaining TTL among the nodes that hold it, as
	// each measured it when it answered. The holder counts its own
	// validity (Lock.Until) to less: it measures from before its request
	// and subtracts the drift allowance. Negative: a node keeps the key
	// without expiry (someone set it by hand). Zero when no node holds
	// Token.
	Remaining time.Duration
	// Fence is the highest fence counter among the nodes that hold Token.
	// With KeyHeld, while the holder's counters live, it is at least the
	// holder's fence, and on single and failover exactly it: no node that
	// holds the key hands out another fence, and on a quorum the majority
	// that answered holding it shares a node with the majority whose
	// counters the grant left at its fence (a quorum's node that granted
	// after its round was decided counted from its own clock, maybe
	// higher). 0 where the
	// nodes keep no counter: fencing off, or a counter that expired
	// (DefaultFenceTTL after the holder's grant, unless the strategy's
	// WithFenceTTL says otherwise) under a lock renewed for longer.
	Fence uint64
	// Waiters is how many waiters keep a place in the key's fair-mode
	// line (WithFairness), the most that any answering node counts.
	// Waiters without fairness keep no place anywhere and are not
	// counted.
	Waiters int
	// Since is when the holder of Token took the key, where it left a
	// record saying so (Holder); the zero time when that is unknown. The
	// library does not record when it grants a key: only `redlease run`
	// leaves a record.
	Since time.Time
	// Holder is the record the holder of Token left beside the key, from
	// any node that has one naming Token, or nil.
	Holder *HolderRecord
	// Nodes has one view per node of the strategy, in the strategy's node
	// order.
	Nodes []NodeView
}

// NodeView is what one node said about a key (see Inspection).
type NodeView struct {
	Node int    // the node's index in the strategy's node list
	Addr string // the node's address, where the client exposes one
	// Err is why the node gave no view (a timeout, a refused connection,
	// a denial, a key of another type); the other fields are then zero.
	Err error
	// Held: the key exists on the node, holding Token.
	Held  bool
	Token string
	// TTL is the key's remaining TTL on the node (PTTL) when it answered;
	// negative for a key without expiry; 0 when the key is not there.
	TTL time.Duration
	// Fence is the node's fence counter for the key: the last fence it
	// handed out (or was raised to), 0 where it keeps none.
	Fence uint64
	// Waiters is how many live entries the node's fair-mode line of the
	// key has.
	Waiters int
	// Holder is the holder's record on this node, when one names Token.
	Holder *HolderRecord
}

// HolderRecord is what a holder recorded about itself beside its lock, at
// redlease:holder:{KEY} on the nodes that granted it: `redlease run` keeps
// one for as long as it holds the key (see the command's documentation).
// A Lock taken through the library records nothing.
type HolderRecord struct {
	Token   string    // the token the record belongs to
	Host    string    // the holder's host name
	PID     int       // the holder's process id on Host
	Since   time.Time // when the holder took the key (zero if unreadable)
	Command string    // what the holder runs under the lock
	Fence   uint64    // the fence of the holder's grant
}

// Inspect reports who holds key, until when, with which fence and how many
// wait for it, as the strategy's nodes say (see Inspector and
// Inspection), without changing anything. The Locker's prefix is applied
// as Lock applies it, and Inspection.Key is key as given. It is bounded by
// the strategy's call bound; errors are those of Inspector.Inspect. A
// strategy that is not an Inspector is refused with ErrInvalid; so is a
// nil Locker. The Locker's Observer sees it as an "inspect" operation,
// and each node that failed in it.
func (l *Locker) Inspect(ctx context.Context, key string) (Inspection, error) {
	if l == nil {
		return Inspection{}, Invalid("nil Locker")
	}
	if key == "" {
		return Inspection{}, Invalid("empty key")
	}
	in, ok := l.defaults.strategy.(Inspector)
	if !ok {
		return Inspection{}, Invalid("strategy %T cannot inspect keys (it is not a redlease.Inspector)", l.defaults.strategy)
	}
	ctx, done := observe(ctx, l.observer, Op{Name: "inspect", Strategy: strategyName(l.defaults.strategy), Key: key})
	v, err := in.Inspect(ctx, l.prefix+key)
	done(err)
	if v.State != "" {
		v.Key = key
	}
	return v, err
}
