package idempotency

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/bounded"
	"github.com/redlease/redlease/internal/nodes"
)

// Barrier makes a request with a given key take effect once: the first
// caller runs the handler while the request's lock is held (and renewed), a
// duplicate after completion gets the stored result marked as replayed, a
// duplicate while it runs gets ErrInProgress (or waits, with Wait), and the
// same key with a different payload gets ErrMismatch. Safe for concurrent
// use.
//
// # What it guarantees
//
// Records live on one Redis (the store). The lock that keeps a request in
// flight exclusive is a redlease lock: by default on the store itself
// (single strategy), or on any Strategy (WithStrategy: quorum for money).
// After the lock is held the record is checked again, in the same script
// that claims it, so a request that completed while we waited for the lock
// is replayed, not rerun. A handler that outlives its lock (a pause, a
// partition) cannot store its result over a newer owner's: Complete checks
// the owner. The result record is as durable as the store (persistence,
// replication); with the default single strategy the lock is too. The
// handler itself must still use the fence (Outcome.Fence) at its own
// storage, since no lock can stop a paused handler's side effects.
type Barrier struct {
	store     redis.UniversalClient
	bound     bool // store ignores contexts on its sockets: calls return at their ctx (internal/bounded)
	locker    *redlease.Locker
	strategy  redlease.Strategy
	onStore   *storeLock // the default strategy on a one-Redis store: two round trips per first request
	keeper    redlease.Keeper
	retention time.Duration
	// retentionMillis is the retention in ms, boxed once: an argument of
	// every completion.
	retentionMillis any
	lease           time.Duration
	maxResult       int
	storeAll        bool
	prefix          string
	// scheme names the lock scheme, recorded by every claim (see
	// lockScheme). A claim never takes over a record claimed through
	// another.
	scheme string

	// Runs in flight, for Close: active counts them; idle, made by the
	// first Close, is closed when none is left; stopping ends (cause
	// ErrClosed) when Close gives up waiting, and cancels their handlers.
	mu       sync.Mutex
	closed   bool
	active   int
	idle     chan struct{}
	stopping context.Context
	stopAll  context.CancelCauseFunc
}

// New returns a Barrier whose records live on store.
func New(store redis.UniversalClient, opts ...Option) (*Barrier, error) {
	if nodes.IsNil(store) {
		return nil, redlease.Invalid("idempotency: nil store client")
	}
	b := &Barrier{store: store, bound: !bounded.HonorsContext(store), retention: DefaultRetention, lease: DefaultLease, maxResult: DefaultMaxResult, prefix: "idem:"}
	b.stopping, b.stopAll = context.WithCancelCause(context.Background())
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o.apply(b); err != nil {
			return nil, err
		}
	}
	if b.retention <= b.lease {
		return nil, redlease.Invalid("idempotency: retention %v must be longer than the lease %v", b.retention, b.lease)
	}
	b.retentionMillis = b.retention.Milliseconds()
	given := b.strategy != nil
	if b.strategy == nil {
		// Fence counters of request locks expire with their records: a
		// request's fences are compared only while its record is kept.
		if c, ok := store.(*redis.Client); ok {
			// One Redis: the record and the lock can share a script.
			sl, err := newStoreLock(c, b.bound, b.retention, b.lease)
			if err != nil {
				return nil, err
			}
			b.onStore, b.strategy = sl, sl
		} else {
			s, err := newOnePrimary(store, b.retention+b.lease)
			if err != nil {
				return nil, err
			}
			b.strategy = s
		}
	}
	scheme, err := lockScheme(store, b.strategy, b.onStore != nil || !given)
	if err != nil {
		return nil, err
	}
	b.scheme = scheme
	lopts := []redlease.Option{redlease.WithTTL(b.lease), redlease.WithPrefix(b.prefix + nsLock)}
	if b.keeper != nil {
		lopts = append(lopts, redlease.WithKeeper(b.keeper))
	}
	l, err := redlease.New(b.strategy, lopts...)
	if err != nil {
		return nil, err
	}
	b.locker = l
	return b, nil
}

// storeScheme is the lock scheme of the store's own lock: the default
// strategy, single on the store, which every Barrier sharing the store's
// records reaches, however its client names the store.
const storeScheme = "store"

// lockScheme names the lock scheme of a Barrier on store with strategy s
// (onStore: the default strategy): storeScheme for the store's own lock,
// and for a strategy that places keys where single would on the store's
// client (redlease.Placer: the same placement, on a client whose address
// names its server); otherwise s's placement, or, if it names none, its
// type. A placement that names a client that does not say which server it
// reaches (a redis.NewFailoverClient's "FailoverClient", or no address) is
// refused with redlease.ErrInvalid: two such strategies on different
// servers would count as one scheme.
func lockScheme(store redis.UniversalClient, s redlease.Strategy, onStore bool) (string, error) {
	if onStore {
		return storeScheme, nil
	}
	p, ok := s.(redlease.Placer)
	if !ok {
		return fmt.Sprintf("%T", s), nil
	}
	pl := p.Placement()
	if anonymousPlacement(pl) {
		return "", redlease.Invalid("idempotency: lock strategy %T names its placement %q, which does not say where its locks live (a redis.NewFailoverClient reports the address %q whatever its master): Barriers locking on two masters would share records as one lock scheme; build a failover strategy with failover.WithMaster(the Sentinel master name), or leave WithStrategy out to lock on the store",
			s, pl, nodes.FailoverAddr)
	}
	if a := nodes.Addr(store); !nodes.Anonymous(a) && pl == "primary "+a {
		return storeScheme, nil
	}
	return pl, nil
}

// anonymousPlacement reports whether placement p ("primary addr", "quorum
// a,b,c") names a node by an address that does not say which server it is
// (nodes.Anonymous).
func anonymousPlacement(p string) bool {
	kind, addrs, _ := strings.Cut(p, " ")
	if kind != "primary" && kind != "quorum" {
		return false
	}
	for _, a := range strings.Split(addrs, ",") {
		if nodes.Anonymous(a) {
			return true
		}
	}
	return false
}

// closeAfterStop, if set (by tests), runs in Close after it cancelled the
// handlers of b's runs in flight, with the channel that closes once they
// have all finished.
var closeAfterStop atomic.Pointer[func(b *Barrier, idle <-chan struct{})]

// enter counts a run in flight, or refuses it once the Barrier is closed.
func (b *Barrier) enter() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return ErrClosed
	}
	b.active++
	return nil
}

// leave counts a run finished (see enter).
func (b *Barrier) leave() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.active--
	if b.active == 0 && b.idle != nil {
		close(b.idle)
	}
}

// Close stops the Barrier: it runs no request from now on (ErrClosed), and
// waits until the runs in flight have finished — their handlers returned
// and their outcomes recorded or released — or until ctx ends, which is
// their shutdown grace. Then it cancels their handlers' contexts
// (context.Cause: ErrClosed) and returns an error that wraps ctx's; those
// runs release their records (or record what their handlers return while
// their locks are valid) on their own, within a lease, and a second Close
// waits for them again. Close may be called any number of times.
func (b *Barrier) Close(ctx context.Context) error {
	b.mu.Lock()
	b.closed = true
	if b.idle == nil {
		b.idle = make(chan struct{})
		if b.active == 0 {
			close(b.idle)
		}
	}
	idle := b.idle
	b.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
	}
	// Whether a handler is cut short is decided here, once: a run leaves
	// under b.mu, so none finishes between the count and the cancel, and
	// the error says exactly that runs were in flight when the grace ended.
	b.mu.Lock()
	cut := b.active > 0
	if cut {
		b.stopAll(ErrClosed)
	}
	b.mu.Unlock()
	if !cut {
		return nil
	}
	if f := closeAfterStop.Load(); f != nil {
		(*f)(b, idle)
	}
	return fmt.Errorf("idempotency: Barrier closed with runs in flight, their handlers' contexts cancelled: %w", context.Cause(ctx))
}
