package single

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/drift"
	"github.com/redlease/redlease/internal/nodes"
	"github.com/redlease/redlease/internal/script"
)

// Strategy keeps locks on one Redis primary (standalone, behind Sentinel, or
// a Cluster, through any redis.UniversalClient). Each call is one round trip
// running one Lua script. It is safe for concurrent use and does not own the
// client.
type Strategy struct {
	client      redis.UniversalClient
	addr        string
	fencing     bool
	driftFactor float64
	err         error // a rejected argument to New, returned by every call
}

var _ redlease.Strategy = (*Strategy)(nil)

// Option configures a Strategy in New.
type Option interface {
	apply(*Strategy) error
}

type optionFunc func(*Strategy) error

func (f optionFunc) apply(s *Strategy) error { return f(s) }

// WithoutFencing turns fencing tokens off (Grant.Fence is 0). Fencing is on
// by default: it costs an INCR inside the same script, but it leaves one
// small counter key per lock name without a TTL, which adds up for
// dedup keys that are never reused.
func WithoutFencing() Option {
	return optionFunc(func(s *Strategy) error {
		s.fencing = false
		return nil
	})
}

// WithDriftFactor sets the share of the TTL allowed for the rate difference
// between this process's clock and the server's: a grant is valid until
// start + ttl − (ttl×factor + 2 ms). Default 0.01. Must be in [0, 1).
func WithDriftFactor(factor float64) Option {
	return optionFunc(func(s *Strategy) error {
		if !(factor >= 0 && factor < 1) {
			return redlease.Invalid("drift factor %v: must be in [0, 1)", factor)
		}
		s.driftFactor = factor
		return nil
	})
}

// New returns a Strategy on client. It does not fail: a nil client or a
// rejected option makes every call return an error that errors.Is
// redlease.ErrInvalid.
func New(client redis.UniversalClient, opts ...Option) *Strategy {
	s := &Strategy{client: client, fencing: true, driftFactor: drift.DefaultFactor}
	if nodes.IsNil(client) {
		s.err = redlease.Invalid("single: nil client")
		return s
	}
	s.addr = nodes.Addr(client)
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(s); err != nil {
			s.err = err
			return s
		}
	}
	return s
}

// Acquire takes key in one round trip: SET NX PX and, with fencing, INCR of
// the key's fence counter, in one script. A key already holding token (a
// retried request whose reply was lost) counts as a grant and keeps its
// fence.
//
// On a network error the script may or may not have run; the key then
// holds token until its TTL unless the next attempt with the same token
// (Locker.Lock reuses it) claims it, or a Release with it removes it.
func (s *Strategy) Acquire(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	if err := s.check(key, token, ttl); err != nil {
		return redlease.Grant{}, err
	}
	if err := ctx.Err(); err != nil {
		return redlease.Grant{}, errors.Join(redlease.ErrNotObtained, context.Cause(ctx))
	}
	mode, fenceKey := any(script.NoFence), key // KEYS[2] is never touched without fencing
	if s.fencing {
		mode, fenceKey = any(script.IncrFence), script.MustFenceKey(key)
	}
	start := time.Now()
	v, err := script.Acquire.Run(ctx, s.client, script.Acquire.Args(key, fenceKey, token, ttl.Milliseconds(), mode))
	switch {
	case err != nil:
		return redlease.Grant{}, s.fail(redlease.ErrNotObtained, err)
	case v == script.Taken:
		return redlease.Grant{}, redlease.ErrNotObtained
	}
	until := start.Add(ttl - drift.Allowance(ttl, s.driftFactor))
	if !time.Now().Before(until) {
		_ = s.Release(context.WithoutCancel(ctx), key, token)
		return redlease.Grant{}, fmt.Errorf("%w: no validity left after %v", redlease.ErrNotObtained, time.Since(start))
	}
	return redlease.Grant{Until: until, Fence: uint64(v)}, nil
}

// Extend resets key's TTL if it still holds token, in one round trip.
func (s *Strategy) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	if err := s.check(key, token, ttl); err != nil {
		return redlease.Grant{}, err
	}
	start := time.Now()
	v, err := script.Extend.Run(ctx, s.client, script.Extend.Args(key, token, ttl.Milliseconds()))
	switch {
	case err != nil:
		return redlease.Grant{}, s.fail(redlease.ErrUnavailable, err)
	case v != 1:
		return redlease.Grant{}, redlease.ErrNotHeld
	}
	until := start.Add(ttl - drift.Allowance(ttl, s.driftFactor))
	if !time.Now().Before(until) {
		return redlease.Grant{}, fmt.Errorf("%w: no validity left after %v", redlease.ErrNotHeld, time.Since(start))
	}
	return redlease.Grant{Until: until}, nil
}

// Release deletes key if it still holds token, in one round trip.
func (s *Strategy) Release(ctx context.Context, key, token string) error {
	if s.err != nil {
		return s.err
	}
	if key == "" {
		return redlease.Invalid("empty key")
	}
	v, err := script.Release.Run(ctx, s.client, script.Release.Args(key, token))
	switch {
	case err != nil:
		return s.fail(redlease.ErrUnavailable, err)
	case v != 1:
		return redlease.ErrNotHeld
	}
	return nil
}

func (s *Strategy) check(key, token string, ttl time.Duration) error {
	if s.err != nil {
		return s.err
	}
	return script.Check(key, token, ttl, s.driftFactor)
}

// fail wraps a node failure under sentinel, keeping ctx errors reachable.
func (s *Strategy) fail(sentinel, err error) error {
	return errors.Join(sentinel, &redlease.NodeError{Node: 0, Addr: s.addr, Err: err})
}
