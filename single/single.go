package single

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/primary"
)

// Strategy keeps locks on one Redis primary (standalone, behind Sentinel, or
// a Cluster, through any redis.UniversalClient). Each call is one round trip
// running one Lua script. It is safe for concurrent use and does not own the
// client.
type Strategy struct {
	p *primary.Primary
}

var (
	_ redlease.Strategy        = (*Strategy)(nil)
	_ redlease.BatchExtender   = (*Strategy)(nil)
	_ redlease.DriftAllowancer = (*Strategy)(nil)
	_ redlease.Fencer          = (*Strategy)(nil)
	_ redlease.Placer          = (*Strategy)(nil)
	_ redlease.Waker           = (*Strategy)(nil)
	_ redlease.Namer           = (*Strategy)(nil)
	_ redlease.Sharder         = (*Strategy)(nil)
)

// Option configures a Strategy in New.
type Option interface {
	apply(*primary.Config) error
}

type optionFunc func(*primary.Config) error

func (f optionFunc) apply(c *primary.Config) error { return f(c) }

// WithoutFencing turns fencing tokens off (Grant.Fence is 0). Fencing is on
// by default: it costs an INCR inside the same script, but it leaves one
// small counter key per lock name without a TTL, which adds up for
// dedup keys that are never reused.
func WithoutFencing() Option { return optionFunc(primary.NoFencing) }

// WithDriftFactor sets the share of the TTL allowed for the rate difference
// between this process's clock and the server's: a grant is valid until
// start + ttl − (ttl×factor + 2 ms). Default 0.01. Must be in [0, 1).
func WithDriftFactor(factor float64) Option { return optionFunc(primary.DriftFactor(factor)) }

// New returns a Strategy on client. A nil client or a rejected option is
// returned as an error that errors.Is redlease.ErrInvalid.
func New(client redis.UniversalClient, opts ...Option) (*Strategy, error) {
	p, err := primary.New(client, primary.Defaults(), opts, Option.apply)
	if err != nil {
		return nil, err
	}
	return &Strategy{p: p}, nil
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
	return s.p.Acquire(ctx, key, token, ttl)
}

// Extend raises key's TTL to ttl if it still holds token (never
// shortening it: see redlease.Strategy), in one round trip.
func (s *Strategy) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	return s.p.Extend(ctx, key, token, ttl)
}

// DriftAllowance is the clock-drift allowance of a grant for ttl (see
// redlease.DriftAllowancer): ttl × the drift factor (WithDriftFactor) +
// 2 ms. Every grant's Until is its call's start plus ttl less this.
func (s *Strategy) DriftAllowance(ttl time.Duration) time.Duration { return s.p.DriftAllowance(ttl) }

// Release deletes key if it still holds token, in one round trip.
func (s *Strategy) Release(ctx context.Context, key, token string) error {
	return s.p.Release(ctx, key, token)
}

// ExtendBatch extends many keys in one pipelined round trip: one script
// call per 500 keys (on a Cluster client, one call per key, each node
// getting its share in one round trip). The watchdog uses it.
func (s *Strategy) ExtendBatch(ctx context.Context, items []redlease.Extension) []redlease.Extended {
	return s.p.ExtendBatch(ctx, items)
}

// Watch subscribes to releases of key, so that a waiting Locker.Lock tries
// again as soon as the holder lets go (see redlease.Waker). All waiters of
// the process on one client share one subscription connection; Watch waits
// at most a second (or ctx) for the server to confirm.
func (s *Strategy) Watch(ctx context.Context, key, waiter string) (<-chan struct{}, func(bool), error) {
	return s.p.Watch(ctx, key, waiter)
}

// Listen subscribes waiter to releases of key without I/O if the process
// already hears them (see redlease.Waker).
func (s *Strategy) Listen(ctx context.Context, key, waiter string) (<-chan struct{}, func(bool), bool) {
	return s.p.Listen(ctx, key, waiter)
}

// Close ends the release subscriptions of this strategy's waiters (they
// fall back to polling; later Watch calls fail) and waits, at most 100 ms,
// for the shared subscription connection to stop if nothing else in the
// process uses it. A connection that go-redis is still dialing to a hung
// server (paused before a waiter came, say) cannot stop sooner than that
// dial gives up, at the client's DialTimeout and ReadTimeout: Close
// returns at 100 ms then, and the connection stops once the dial fails.
// Locks keep working; the client is not closed. Calling it is optional:
// the subscription connection closes on its own once no waiter is left.
func (s *Strategy) Close() error { return s.p.Close() }

// Placement names the primary the strategy locks on: "primary " and its
// client's address, the same for single and failover on one client (see
// redlease.Placer).
func (s *Strategy) Placement() string { return s.p.Placement() }

// Fencing reports whether grants carry fences: true unless built
// WithoutFencing (see redlease.Fencer).
func (s *Strategy) Fencing() bool { return s.p.Fencing() }

// Name returns "single", for observers (see redlease.Namer).
func (s *Strategy) Name() string { return "single" }

// WithFenceTTL sets how long a lock's fence counter lives after its last
// grant: d, or the acquisition's TTL if that is longer. Default
// redlease.DefaultFenceTTL. Every counter expires; one created anew
// starts from the server's clock in microseconds, so its first fence is
// above every fence the expired one handed out (the argument and its
// assumptions: the server's clock does not step back by d across the
// expiry). d must be at least every TTL acquired with; an Acquire with a
// longer TTL is refused. Give every client of the same keys the same
// setting.
func WithFenceTTL(d time.Duration) Option { return optionFunc(primary.FenceTTL(d)) }

// WithClock makes the strategy judge validity by c. Default
// redlease.SystemClock(); another Clock is for tests that emulate a clock
// running at the wrong rate (see redlease.Clock). Give the Locker the same
// clock.
func WithClock(c redlease.Clock) Option { return optionFunc(primary.UseClock(c)) }

var _ redlease.Queuer = (*Strategy)(nil)

// AcquireInLine is Acquire in fair mode (see redlease.Queuer and the
// package documentation): the waiter joins the key's line on the primary
// at place's ticket, and a free key goes to the line's head only.
func (s *Strategy) AcquireInLine(ctx context.Context, key, token string, ttl time.Duration, place redlease.Place) (redlease.Grant, error) {
	return s.p.AcquireInLine(ctx, key, token, ttl, place)
}

// LeaveLine removes waiter id's entry from key's line, in one round trip.
func (s *Strategy) LeaveLine(ctx context.Context, key, id string) error {
	return s.p.LeaveLine(ctx, key, id)
}

// Shard names the Cluster master that serves key now, by the client's last
// known topology; "" on a client that is not a Cluster client (see
// redlease.Sharder: the watchdogs renew each master's locks apart).
func (s *Strategy) Shard(key string) string { return s.p.Shard(key) }
