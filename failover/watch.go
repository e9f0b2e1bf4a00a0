package failover

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
)

// DefaultPollInterval is how often a Watcher asks the Sentinels for the
// current primary, as a backstop for a +switch-master message it missed.
const DefaultPollInterval = 500 * time.Millisecond

// Watcher revokes a Strategy's locks when Sentinel moves the primary. It
// listens for +switch-master on every Sentinel it is given, and polls them
// for the primary's address in case a message was lost with a connection.
type Watcher struct {
	s        *Strategy
	master   string
	sents    []*redis.SentinelClient
	pubsubs  []*redis.PubSub
	interval time.Duration
	stop     chan struct{}
	wg       sync.WaitGroup

	mu      sync.Mutex
	current string // the primary's address as last agreed
	revoked int
}

// Watch starts a Watcher for master on sentinels (at least one; use all of
// them, so one Sentinel's restart cannot hide a failover). It fails if no
// Sentinel knows master. pollInterval 0 means DefaultPollInterval. Close
// stops it.
//
// On a failover every lock the strategy granted and that is still held is
// marked lost, with a cause that errors.Is redlease.ErrFailover: its Lost
// closes and Locker.Do cancels its function. That is conservative: a lock
// the new primary did receive (WAIT covered it) is revoked too, and its
// holder must take it again; the key itself stays until it is released or
// expires, so the next holder waits for that, and gets a higher fence.
func Watch(ctx context.Context, s *Strategy, master string, pollInterval time.Duration, sentinels ...*redis.SentinelClient) (*Watcher, error) {
	if s == nil || master == "" || len(sentinels) == 0 {
		return nil, redlease.Invalid("failover.Watch: need a strategy, a master name and at least one Sentinel")
	}
	if pollInterval < 0 {
		return nil, redlease.Invalid("failover.Watch: poll interval %v: must not be negative", pollInterval)
	}
	if pollInterval == 0 {
		pollInterval = DefaultPollInterval
	}
	w := &Watcher{s: s, master: master, sents: append([]*redis.SentinelClient(nil), sentinels...),
		interval: pollInterval, stop: make(chan struct{})}
	addr, err := w.agreedPrimary(ctx)
	if err != nil {
		return nil, err
	}
	w.current = addr
	for _, sc := range w.sents {
		ps := sc.Subscribe(ctx, "+switch-master")
		if _, err := ps.Receive(ctx); err != nil {
			_ = ps.Close()
			continue // this Sentinel is down now; polling still covers it
		}
		w.pubsubs = append(w.pubsubs, ps)
		ch := ps.Channel()
		w.wg.Go(func() {
			for {
				select {
				case msg, ok := <-ch:
					if !ok {
						return
					}
					w.onSwitch(msg.Payload)
				case <-w.stop:
					return
				}
			}
		})
	}
	w.wg.Go(w.poll)
	return w, nil
}

// Primary returns the primary's address as the Watcher last saw it.
func (w *Watcher) Primary() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.current
}

// Revoked returns how many locks the Watcher has revoked so far.
func (w *Watcher) Revoked() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.revoked
}

// Close stops the Watcher's goroutines and subscriptions. It does not close
// the Sentinel clients.
func (w *Watcher) Close() error {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	for _, ps := range w.pubsubs {
		_ = ps.Close()
	}
	w.wg.Wait()
	return nil
}

// onSwitch handles "<master> <old-ip> <old-port> <new-ip> <new-port>".
func (w *Watcher) onSwitch(payload string) {
	f := strings.Fields(payload)
	if len(f) != 5 || f[0] != w.master {
		return
	}
	w.switched(net.JoinHostPort(f[3], f[4]))
}

func (w *Watcher) switched(addr string) {
	w.mu.Lock()
	if addr == w.current {
		w.mu.Unlock()
		return // another Sentinel's message, or a poll, got here first
	}
	w.current = addr
	w.mu.Unlock()
	n := w.s.RevokeAll(fmt.Errorf("%w: %s now at %s", redlease.ErrFailover, w.master, addr))
	w.mu.Lock()
	w.revoked += n
	w.mu.Unlock()
}

// poll asks the Sentinels for the primary every interval. Right after a
// failover some Sentinels still name the old primary for a moment, so only
// an address that a majority of the answering Sentinels agree on counts.
func (w *Watcher) poll() {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), w.interval)
			addr, err := w.agreedPrimary(ctx)
			cancel()
			if err == nil {
				w.switched(addr)
			}
		case <-w.stop:
			return
		}
	}
}

// agreedPrimary returns the primary address named by a majority of the
// Sentinels that answered.
func (w *Watcher) agreedPrimary(ctx context.Context) (string, error) {
	votes := map[string]int{}
	answered := 0
	var lastErr error
	for _, sc := range w.sents {
		a, err := sc.GetMasterAddrByName(ctx, w.master).Result()
		if err != nil || len(a) != 2 {
			lastErr = err
			continue
		}
		answered++
		votes[net.JoinHostPort(a[0], a[1])]++
	}
	for addr, n := range votes {
		if 2*n > answered {
			return addr, nil
		}
	}
	if answered == 0 {
		return "", fmt.Errorf("failover.Watch: no Sentinel knows master %q: %w", w.master, lastErr)
	}
	return "", fmt.Errorf("failover.Watch: Sentinels disagree on master %q: %v", w.master, votes)
}
