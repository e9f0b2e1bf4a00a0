package idempotency

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/bounded"
	"github.com/redlease/redlease/internal/fused"
	"github.com/redlease/redlease/internal/primary"
	"github.com/redlease/redlease/internal/script"
)

// storeLock is the Barrier's default lock strategy when its store is one
// Redis (a *redis.Client: standalone or behind Sentinel, not a Cluster or
// a Ring, where a record and its lock live in different slots): the lock
// logic of the single strategy (internal/primary) on the store, with
// fencing and the fence counter TTL retention+lease. Observers see it
// named "idempotency".
//
// run's TryLock gives its attempt the request's claim (a fused script,
// see internal/fused), which the primary's acquisition runs in place of
// its own script: claimLockScript peeks at the record, takes the lock and
// claims the record in one round trip. The record's state comes back in
// the claim; a request found done or refused (mismatch) takes no lock,
// and the acquisition answers errSettled. The script is written out by
// hand (see scripts.go): it does what the record's peek, single's Acquire
// and the record's claim do one after the other, less fair mode's line,
// which no Barrier uses. The completion is the record's own script, and
// it leaves the lock to expire (Barrier.leavesLock).
//
// So a first request costs two round trips, and the handler's lock is
// still a *redlease.Lock made by the Barrier's Locker: validity measured
// from before the request was sent, less single's drift allowance; Lost,
// the loss margin, renewal by a Keeper (Extend and ExtendBatch are
// single's).
type storeLock struct {
	p     *primary.Primary
	store redis.UniversalClient
	// bound: store ignores contexts on its sockets (internal/bounded).
	bound bool
	// retentionMillis: the retention in ms, boxed once (a claim's
	// argument).
	retentionMillis any
}

var (
	_ redlease.Strategy              = (*storeLock)(nil)
	_ redlease.BatchExtender         = (*storeLock)(nil)
	_ redlease.DriftAllowancer       = (*storeLock)(nil)
	_ redlease.Namer                 = (*storeLock)(nil)
	_ fused.Acquirer[redlease.Grant] = (*storeLock)(nil)
	_ fused.Script                   = (*claim)(nil)
	_ redlease.DriftAllowancer       = onePrimary{}
	_ redlease.Namer                 = onePrimary{}
)

// newStoreLock returns the lock strategy for a Barrier whose store is c.
func newStoreLock(c *redis.Client, bound bool, retention, lease time.Duration) (*storeLock, error) {
	one, err := newOnePrimary(c, retention+lease)
	if err != nil {
		return nil, err
	}
	return &storeLock{p: one.Primary, store: c, bound: bound, retentionMillis: retention.Milliseconds()}, nil
}

// onePrimary is the single strategy on the store, built from the code the
// single package is built from (internal/primary), so that this package
// does not import a sibling strategy package: the default lock of a
// Barrier whose store is not one *redis.Client (a Cluster, failover or
// ring client).
type onePrimary struct{ *primary.Primary }

// Name is single's (see redlease.Namer).
func (onePrimary) Name() string { return "single" }

// newOnePrimary returns single's strategy on store with fence counters
// kept fenceTTL after their last grant (single.WithFenceTTL).
func newOnePrimary(store redis.UniversalClient, fenceTTL time.Duration) (onePrimary, error) {
	p, err := primary.New(store, primary.Defaults(), []func(*primary.Config) error{primary.FenceTTL(fenceTTL)},
		func(o func(*primary.Config) error, c *primary.Config) error { return o(c) })
	if err != nil {
		return onePrimary{}, err
	}
	return onePrimary{p}, nil
}

// Acquire is single's.
func (s *storeLock) Acquire(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	return s.p.Acquire(ctx, key, token, ttl)
}

// AcquireFused is single's Acquire running f (a claim) in place of its
// script (see primary.Primary.AcquireFused).
func (s *storeLock) AcquireFused(ctx context.Context, key, token string, ttl time.Duration, f fused.Script) (redlease.Grant, error) {
	return s.p.AcquireFused(ctx, key, token, ttl, f)
}

// DriftAllowance is single's (see redlease.DriftAllowancer): every grant,
// the claim's included, ends this much before its call's start plus ttl.
func (s *storeLock) DriftAllowance(ttl time.Duration) time.Duration {
	return s.p.DriftAllowance(ttl)
}

// Extend is single's.
func (s *storeLock) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	return s.p.Extend(ctx, key, token, ttl)
}

// ExtendBatch is single's: a Keeper renews the Barrier's locks in batches.
func (s *storeLock) ExtendBatch(ctx context.Context, items []redlease.Extension) []redlease.Extended {
	return s.p.ExtendBatch(ctx, items)
}

// Release is single's.
func (s *storeLock) Release(ctx context.Context, key, token string) error {
	return s.p.Release(ctx, key, token)
}

// Name returns "idempotency", for observers (see redlease.Namer): the lock of a Barrier on its
// store, whose acquisitions claim records.
func (s *storeLock) Name() string { return "idempotency" }

// claimOption returns the option that makes run's TryLock claim c's
// record with the lock (see storeLock).
func claimOption(c *claim) redlease.LockOption {
	return fused.Option(c).(redlease.LockOption)
}

// Script arguments, boxed once.
var (
	storeSchemeArg any = storeScheme // the lock scheme of every claim through storeLock
	noFP           any = ""
	undoArg        any = "0" // undoClaimScript: the undo of a failed attempt
)

// claim is one request's claim, run by run's TryLock as the acquisition's
// script (a fused.Script), which fills in st.
type claim struct {
	s   *storeLock
	rec string // the record's key
	fp  string // the request's fingerprint
	st  status // set by Run: "claimed", "progress", "done" or "mismatch"
}

// errSettled is the claim's answer for a request that is done, or whose
// payload differs: no lock was taken, and the claim says why. It
// errors.Is redlease.ErrNotObtained, as every refused Acquire must.
var errSettled = fmt.Errorf("%w: the request is settled (done, or its payload differs); no lock taken", redlease.ErrNotObtained)

// AppendLine appends claimLockScript's command line.
func (c *claim) AppendLine(line []any, key, fenceKey, token string, ttlMillis, fenceTTLMillis any) []any {
	fp := noFP
	if c.fp != "" {
		fp = c.fp
	}
	return claimLockScript.AppendArgs(line, c.rec, key, fenceKey, token, ttlMillis, fenceTTLMillis, fp, c.s.retentionMillis, storeSchemeArg)
}

// Run sends the claim and reads its reply (parseClaim) into st: a grant's
// fence, the lock's refusal, or errSettled.
func (c *claim) Run(ctx context.Context, line []any) (int64, error) {
	reply, err := claimLockScript.RunValue(ctx, c.s.store, line)
	if err != nil {
		return 0, err
	}
	st, v, err := parseClaim(reply)
	if err != nil {
		return 0, err
	}
	c.st = st
	switch st.state {
	case "done", "mismatch":
		return 0, errSettled
	case "held":
		if !script.IsTaken(v) {
			return script.Taken, nil
		}
	}
	return v, nil
}

// Undo forgets the record if token still owns it in progress and releases
// key if it still holds token (undoClaimScript, as an undo), bounded by
// ctx whatever the store's client.
func (c *claim) Undo(ctx context.Context, key, token string) {
	_, _ = bounded.Call(ctx, c.s.bound, func(ctx context.Context) (int64, error) {
		return undoClaimScript.Run(ctx, c.s.store, undoClaimScript.Args(c.rec, key, script.QueueKey(key), token, undoArg))
	}, nil)
}

// parseClaim reads a claimLockScript reply: the record's status and, for
// "claimed" and "progress", the fence; for "held", Acquire's refusal.
func parseClaim(reply any) (st status, v int64, err error) {
	switch r := reply.(type) {
	case int64:
		switch {
		case r > 0:
			return status{state: "claimed"}, r, nil
		case r < 0:
			return status{state: "held"}, r, nil
		}
	case string:
		switch {
		case r == "m":
			return status{state: "mismatch"}, 0, nil
		case strings.HasPrefix(r, "d"):
			if kind, result, ok := strings.Cut(r[1:], ":"); ok {
				return status{state: "done", kind: kind, result: []byte(result)}, 0, nil
			}
		case strings.HasPrefix(r, "p"):
			if f, perr := strconv.ParseInt(r[1:], 10, 64); perr == nil && f > 0 {
				return status{state: "progress"}, f, nil
			}
		}
	}
	return status{}, 0, fmt.Errorf("idempotency: claim reply %v", reply)
}
