package failover

import (
	"context"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/primary"
)

// Defaults, in one place.
const (
	// DefaultReplicas is how many replicas must acknowledge each write.
	DefaultReplicas = 1
	// DefaultWaitTimeout bounds each WAIT.
	DefaultWaitTimeout = 100 * time.Millisecond
)

// Strategy keeps locks on a Redis primary with replicas and grants a lock
// only once enough replicas acknowledged it. It is safe for concurrent use
// and does not own the client.
type Strategy struct {
	p *primary.Primary

	mu      sync.Mutex
	granted map[grant]func(error) // live grants, to revoke on a failover
}

type grant struct{ key, token string }

var (
	_ redlease.Strategy        = (*Strategy)(nil)
	_ redlease.BatchExtender   = (*Strategy)(nil)
	_ redlease.DriftAllowancer = (*Strategy)(nil)
	_ redlease.Fencer          = (*Strategy)(nil)
	_ redlease.Placer          = (*Strategy)(nil)
	_ redlease.Waker           = (*Strategy)(nil)
	_ redlease.Revoker         = (*Strategy)(nil)
	_ redlease.Namer           = (*Strategy)(nil)
	_ redlease.Sharder         = (*Strategy)(nil)
)

// Option configures a Strategy in New.
type Option interface {
	apply(*primary.Config) error
}

type optionFunc func(*primary.Config) error

func (f optionFunc) apply(c *primary.Config) error { return f(c) }

// WithReplicas sets how many replicas must acknowledge every acquisition
// and extension. Default DefaultReplicas (1). Must be at least 1. On a
// Cluster client every replica of the key's shard must acknowledge, and n
// is the least that suffices: a shard that lists fewer grants nothing
// (the default there is none).
func WithReplicas(n int) Option {
	return optionFunc(func(c *primary.Config) error {
		if n < 1 {
			return redlease.Invalid("replicas %d: must be at least 1 (use the single strategy for none)", n)
		}
		c.Replicas = n
		return nil
	})
}

// WithWaitTimeout bounds how long each write waits for its replicas.
// Default DefaultWaitTimeout (100 ms). Must be at least a millisecond (WAIT
// with 0 would block forever).
func WithWaitTimeout(d time.Duration) Option {
	return optionFunc(func(c *primary.Config) error {
		if d < time.Millisecond {
			return redlease.Invalid("wait timeout %v: must be at least 1ms", d)
		}
		c.WaitTimeout = d
		return nil
	})
}

// WithMaster names the Sentinel master whose primary the client follows
// (redis.FailoverOptions.MasterName). The strategy's placement is then
// "failover " and name (see Placement), which tells its locks apart from
// those of a strategy on another master: a redis.NewFailoverClient reports
// the address "FailoverClient" whatever its master, so without it every
// such strategy names the same placement. The idempotency package refuses a
// lock strategy over such a client unless it names its master. The name
// is all that tells masters apart: two Sentinel deployments that both call
// their master "mymaster" name one placement, so their Barriers must not
// share a store and prefix (rename one master). NewWatcher refuses a master
// name other than name. An empty name, or one with a space or a control
// character (Sentinel's messages separate fields by spaces), is refused
// with redlease.ErrInvalid.
func WithMaster(name string) Option {
	return optionFunc(func(c *primary.Config) error {
		if name == "" || strings.IndexFunc(name, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
			return redlease.Invalid("failover: master name %q: must be non-empty, without spaces or control characters", name)
		}
		c.Master = name
		return nil
	})
}

// WithoutFencing turns fencing tokens off. Fencing is on by default.
func WithoutFencing() Option { return optionFunc(primary.NoFencing) }

// WithDriftFactor sets the share of the TTL allowed for clock-rate
// differences. Default 0.01. Must be in [0, 1).
func WithDriftFactor(factor float64) Option { return optionFunc(primary.DriftFactor(factor)) }

// New returns a Strategy on client: a standalone client, usually one from
// redis.NewFailoverClient, or a Cluster client. On a Cluster client every
// acquisition and extension runs on its key's master, followed in the
// same pipeline by WAIT for every replica that the master's shard lists
// in CLUSTER SHARDS (see the package doc, "Redis Cluster"); WithReplicas
// then sets a minimum, which is 0 by default there. A nil client, or a
// rejected option, is returned as an error that errors.Is
// redlease.ErrInvalid.
func New(client redis.UniversalClient, opts ...Option) (*Strategy, error) {
	cfg := primary.Defaults()
	cfg.Replicas, cfg.WaitTimeout = DefaultReplicas, DefaultWaitTimeout
	if cc, ok := client.(*redis.ClusterClient); ok && cc != nil {
		cfg.Replicas, cfg.AllReplicas = 0, true
	}
	p, err := primary.New(client, cfg, opts, Option.apply)
	if err != nil {
		return nil, err
	}
	return &Strategy{p: p, granted: map[grant]func(error){}}, nil
}

// Acquire takes key with SET NX PX (and the fence INCR) followed by WAIT in
// the same pipeline, one round trip. If fewer replicas than required
// acknowledged, the key is released again and the error errors.Is both
// redlease.ErrUnavailable and ErrNotReplicated, and not ErrNotObtained: an
// outage (a paused or lagging replica, a failover under way), not a holder.
func (s *Strategy) Acquire(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	return s.p.Acquire(ctx, key, token, ttl)
}

// Extend raises key's TTL to ttl (never shortening it: see
// redlease.Strategy), followed by WAIT. An extension too few replicas
// acknowledged errors.Is redlease.ErrUnavailable and ErrNotReplicated: the
// lock keeps its previous Until, and the watchdog tries again.
func (s *Strategy) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	return s.p.Extend(ctx, key, token, ttl)
}

// ExtendBatch extends many keys in one pipelined round trip with one WAIT.
func (s *Strategy) ExtendBatch(ctx context.Context, items []redlease.Extension) []redlease.Extended {
	return s.p.ExtendBatch(ctx, items)
}

// DriftAllowance is the clock-drift allowance of a grant for ttl (see
// redlease.DriftAllowancer): ttl × the drift factor (WithDriftFactor) +
// 2 ms. Every grant's Until is its call's start plus ttl less this.
func (s *Strategy) DriftAllowance(ttl time.Duration) time.Duration { return s.p.DriftAllowance(ttl) }

// Release deletes key if it still holds token, without waiting for
// replicas.
func (s *Strategy) Release(ctx context.Context, key, token string) error {
	return s.p.Release(ctx, key, token)
}

// Track remembers an acquisition of this strategy, from before its request
// is sent until untrack, so that RevokeAll (called by a Watcher on a
// Sentinel failover) can mark the lock lost, even one whose grant was still
// on its way. The Locker calls it; there is no need to call it yourself.
func (s *Strategy) Track(key, token string, revoke func(error)) (untrack func()) {
	g := grant{key, token}
	s.mu.Lock()
	s.granted[g] = revoke
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		delete(s.granted, g)
		s.mu.Unlock()
	}
}

// RevokeAll marks every lock this strategy granted and that is still held
// as lost, with cause: a failover may have promoted a replica that never
// received them, and even WAIT's acknowledgement is no proof the promoted
// replica was one that acknowledged. It returns how many locks it revoked.
func (s *Strategy) RevokeAll(cause error) int {
	s.mu.Lock()
	revoke := make([]func(error), 0, len(s.granted))
	for g, f := range s.granted {
		revoke = append(revoke, f)
		delete(s.granted, g)
	}
	s.mu.Unlock()
	for _, f := range revoke { // outside s.mu: f takes the lock's own mutex
		f(cause)
	}
	return len(revoke)
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

// Placement names where the strategy locks (see redlease.Placer): built
// WithMaster, "failover " and the master's name; otherwise "primary " and
// its client's address, the same for single and failover on one client
// ("primary FailoverClient" for every redis.NewFailoverClient).
func (s *Strategy) Placement() string { return s.p.Placement() }

// Master is the master name the strategy was built with (WithMaster), or
// "".
func (s *Strategy) Master() string { return s.p.Master() }

// Fencing reports whether grants carry fences: true unless built
// WithoutFencing (see redlease.Fencer).
func (s *Strategy) Fencing() bool { return s.p.Fencing() }

// Name returns "failover", for observers (see redlease.Namer).
func (s *Strategy) Name() string { return "failover" }

// WithFenceTTL sets how long a lock's fence counter lives after its last
// grant: d, or the acquisition's TTL if that is longer. Default
// redlease.DefaultFenceTTL. Every counter expires; one created anew
// starts from the server's clock in microseconds, so its first fence is
// above every fence the expired one handed out (the argument and its
// assumptions: the server's clock does not step back by d across the
// expiry; a promoted replica's clock is not behind the old primary's by
// d). d must be at least every TTL acquired with; an Acquire with a longer
// TTL is refused. Give every client of the same keys the same setting.
func WithFenceTTL(d time.Duration) Option { return optionFunc(primary.FenceTTL(d)) }

// WithClock makes the strategy judge validity by c. Default
// redlease.SystemClock(); another Clock is for tests that emulate a clock
// running at the wrong rate (see redlease.Clock). Give the Locker the same
// clock.
func WithClock(c redlease.Clock) Option { return optionFunc(primary.UseClock(c)) }

var _ redlease.Queuer = (*Strategy)(nil)

// AcquireInLine is Acquire in fair mode (see redlease.Queuer): the
// waiter joins the key's line on the primary at place's ticket, and a free
// key goes to the line's head only; the grant is acknowledged by replicas
// as Acquire's is. The line itself is not waited for: a failover that
// loses it costs order, not safety (the waiters rebuild it with their next
// attempts).
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
