package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/bounded"
	"github.com/redlease/redlease/internal/nodes"
	"github.com/redlease/redlease/internal/primary"
	"github.com/redlease/redlease/internal/script"
)

// storeLock is the Barrier's default lock strategy when its store is one
// Redis (a *redis.Client: standalone or behind Sentinel, not a Cluster or
// a Ring, where a record and its lock live in different slots). It is the
// single strategy on the store, with fencing and the fence counter TTL
// retention+lease, and every call that carries no request goes to that
// strategy unchanged. One call carries a request, in its ctx, and then
// runs a combined script instead of three separate calls: Acquire with a
// claim (run's TryLock), where claimLockScript peeks at the record, takes
// the lock and claims the record in one round trip. The record's state
// comes back in the claim; a request found done or refused (mismatch)
// takes no lock, and Acquire answers errSettled. The script is written
// out by hand (see scripts.go): it does what the record's peek, single's
// Acquire and the record's claim do one after the other, less fair mode's
// line, which no Barrier uses. The completion is the record's own script,
// and it leaves the lock to expire (Barrier.leavesLock).
//
// So a first request costs two round trips, and the handler's lock is
// still a *redlease.Lock made by the Barrier's Locker: validity measured
// from before the request was sent, less single's drift allowance; Lost,
// the loss margin, renewal by a Keeper (Extend and ExtendBatch are
// single's), all as before.
type storeLock struct {
	single onePrimary
	store  redis.UniversalClient
	addr   string
	// bound: store ignores contexts on its sockets (internal/bounded).
	// Unbound, the claim calls its script directly: the closure
	// bounded.Call takes escapes (to the goroutine of its bound case) and
	// costs an allocation per call.
	bound    bool
	fenceTTL time.Duration
	lease    time.Duration
	// Script arguments that never change (or, the lease, almost never),
	// boxed once.
	fenceTTLMillis, retentionMillis, leaseMillis any
}

var (
	_ redlease.Strategy        = (*storeLock)(nil)
	_ redlease.BatchExtender   = (*storeLock)(nil)
	_ redlease.DriftAllowancer = (*storeLock)(nil)
	_ redlease.DriftAllowancer = onePrimary{}
)

// newStoreLock returns the lock strategy for a Barrier whose store is c.
func newStoreLock(c *redis.Client, bound bool, retention, lease time.Duration) (*storeLock, error) {
	fenceTTL := retention + lease
	one, err := newOnePrimary(c, fenceTTL)
	if err != nil {
		return nil, err
	}
	return &storeLock{
		single:   one,
		store:    c,
		addr:     nodes.Addr(c),
		bound:    bound,
		fenceTTL: fenceTTL,
		lease:    lease,

		fenceTTLMillis:  fenceTTL.Milliseconds(),
		retentionMillis: retention.Milliseconds(),
		leaseMillis:     lease.Milliseconds(),
	}, nil
}

// onePrimary is the single strategy on the store, built from the code the
// single package is built from (internal/primary), so that this package
// does not import a sibling strategy package: the default lock of a
// Barrier whose store is not one *redis.Client (a Cluster, failover or
// ring client), and the part of storeLock that is single's unchanged.
type onePrimary struct{ *primary.Primary }

// Name is single's.
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

// Script arguments, boxed once.
var (
	storeSchemeArg any = storeScheme // the lock scheme of every claim through storeLock
	noFP           any = ""
	undoArg        any = "0" // undoClaimScript: the undo of a failed attempt
	giveBack       any = "1" // undoClaimScript: a grant given back (a holder's release)
)

// ttlArg returns ttl in ms, boxed (once, for the lease).
func (s *storeLock) ttlArg(ttl time.Duration) any {
	if ttl == s.lease {
		return s.leaseMillis
	}
	return ttl.Milliseconds()
}

// claim is one request's claim, carried by the ctx of its TryLock to
// storeLock.Acquire, which fills in st.
type claim struct {
	rec string // the record's key
	fp  string // the request's fingerprint
	st  status // set by Acquire: "claimed", "progress", "done" or "mismatch"
}

type claimCtxKey struct{}

// withClaim returns ctx carrying c to storeLock.Acquire. Only the ctx of
// the TryLock of run carries it: not the handler's, whose own Barrier
// calls must not see it.
func withClaim(ctx context.Context, c *claim) context.Context {
	return context.WithValue(ctx, claimCtxKey{}, c)
}

// errSettled is storeLock.Acquire's answer for a request that is done, or
// whose payload differs: no lock was taken, and the claim says why. It
// errors.Is redlease.ErrNotObtained, as every refused Acquire must.
var errSettled = fmt.Errorf("%w: the request is settled (done, or its payload differs); no lock taken", redlease.ErrNotObtained)

// Acquire takes key for token. With a claim in ctx, it also reads and
// claims the claim's record in the same script (claimLockScript), and
// reports the record's state in the claim. It follows single's Acquire
// step for step: the same arguments checked, the same validity (from
// before the request was sent, less the drift allowance), the same
// refusals; and whatever a failed attempt may have written — the lock, and
// the record's claim — is undone by this attempt's token only, at once, or
// when an abandoned call returns.
func (s *storeLock) Acquire(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	c, _ := ctx.Value(claimCtxKey{}).(*claim)
	if c == nil {
		return s.single.Acquire(ctx, key, token, ttl)
	}
	if err := s.single.Check(key, token, ttl); err != nil {
		return redlease.Grant{}, err
	}
	if ttl > s.fenceTTL {
		return redlease.Grant{}, redlease.Invalid("ttl %v: longer than the fence counter TTL %v, which must outlive the lock", ttl, s.fenceTTL)
	}
	if err := ctx.Err(); err != nil {
		return redlease.Grant{}, redlease.Wrap(redlease.ErrNotObtained, context.Cause(ctx))
	}
	fp := noFP
	if c.fp != "" {
		fp = c.fp
	}
	line := claimLockScript.Args(c.rec, key, script.MustFenceKey(key), token, s.ttlArg(ttl),
		s.fenceTTLMillis, fp, s.retentionMillis, storeSchemeArg)
	start := time.Now()
	var (
		reply any
		err   error
	)
	if s.bound {
		reply, err = bounded.Call(ctx, true, func(ctx context.Context) (any, error) {
			return claimLockScript.RunValue(ctx, s.store, line)
		}, func(reply any, err error) {
			// Abandoned, so reported as not obtained: whatever it wrote
			// goes, by this attempt's token only.
			if (err == nil && granted(reply)) || (err != nil && !primary.NotSent(err)) {
				ctx, cancel := context.WithTimeout(context.Background(), ttl)
				defer cancel()
				_, _ = s.undoClaim(ctx, c.rec, key, token, undoArg)
			}
		})
	} else {
		reply, err = claimLockScript.RunValue(ctx, s.store, line)
	}
	if err != nil {
		var ab bounded.Abandoned
		if !primary.NotSent(err) && !errors.As(err, &ab) { // an abandoned call undoes itself when it returns
			// The script may have run and its reply been lost: without
			// this the lock would block every retry until its TTL.
			s.undoNow(ctx, ttl, c.rec, key, token)
		}
		return redlease.Grant{}, primary.Fail(ctx, s.addr, primary.ErrAcquireUnavailable, err)
	}
	st, v, err := parseClaim(reply)
	if err != nil {
		s.undoNow(ctx, ttl, c.rec, key, token)
		return redlease.Grant{}, primary.Fail(ctx, s.addr, primary.ErrAcquireUnavailable, err)
	}
	switch st.state {
	case "done", "mismatch":
		c.st = st
		return redlease.Grant{}, errSettled
	case "held":
		if d, ok := script.Remaining(v); ok {
			return redlease.Grant{}, &redlease.HeldError{Remaining: d}
		}
		return redlease.Grant{}, redlease.ErrNotObtained
	}
	until := start.Add(ttl - s.DriftAllowance(ttl))
	if now := time.Now(); !now.Before(until) {
		s.undoNow(ctx, ttl, c.rec, key, token)
		return redlease.Grant{}, fmt.Errorf("%w: no validity left after %v", redlease.ErrNotObtained, now.Sub(start))
	}
	c.st = st
	return redlease.Grant{Until: until, Fence: uint64(v)}, nil
}

// undoNow undoes a failed Acquire (undoClaim), bounded by a tenth of the ttl
// (the Locker's default loss margin) past ctx's end: it is best effort,
// and the lock expires on its own.
func (s *storeLock) undoNow(ctx context.Context, ttl time.Duration, rec, key, token string) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ttl/redlease.DefaultLossMarginDivisor)
	defer cancel()
	_, _ = bounded.Call(uctx, s.bound, func(ctx context.Context) (bool, error) {
		return s.undoClaim(ctx, rec, key, token, undoArg)
	}, nil)
}

// granted reports whether a claimLockScript reply took the lock.
func granted(reply any) bool {
	st, _, err := parseClaim(reply)
	return err == nil && (st.state == "claimed" || st.state == "progress")
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

// undoClaim forgets the record if token still owns it in progress and
// releases key if it still holds token (undoClaimScript; how: undoArg or
// giveBack), and reports whether the lock was released.
func (s *storeLock) undoClaim(ctx context.Context, rec, key, token string, how any) (released bool, err error) {
	v, err := undoClaimScript.Run(ctx, s.store, undoClaimScript.Args(rec, key, script.QueueKey(key), token, how))
	return err == nil && v&1 == 1, err
}

// DriftAllowance is single's (see redlease.DriftAllowancer): every grant,
// the claim's included, ends this much before its call's start plus ttl.
func (s *storeLock) DriftAllowance(ttl time.Duration) time.Duration {
	return s.single.DriftAllowance(ttl)
}

// Extend is single's.
func (s *storeLock) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	return s.single.Extend(ctx, key, token, ttl)
}

// ExtendBatch is single's: a Keeper renews the Barrier's locks in batches.
func (s *storeLock) ExtendBatch(ctx context.Context, items []redlease.Extension) []redlease.Extended {
	return s.single.ExtendBatch(ctx, items)
}

// Release releases key if it holds token. With a claim in ctx (the
// Locker giving back a grant that came with too little validity left), it
// also forgets the claim, by token. An answer that says the lock was not
// released is ErrNotHeld.
func (s *storeLock) Release(ctx context.Context, key, token string) error {
	if c, _ := ctx.Value(claimCtxKey{}).(*claim); c != nil {
		released, err := bounded.Call(ctx, s.bound, func(ctx context.Context) (bool, error) {
			return s.undoClaim(ctx, c.rec, key, token, giveBack)
		}, nil)
		switch {
		case err != nil:
			return primary.Fail(ctx, s.addr, redlease.ErrUnavailable, err)
		case !released:
			return redlease.ErrNotHeld
		}
		return nil
	}
	return s.single.Release(ctx, key, token)
}

// Name returns "single", for observers: the lock is single's, on the store.
func (s *storeLock) Name() string { return "single" }
