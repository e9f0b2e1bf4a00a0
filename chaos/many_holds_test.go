package chaos

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/renew"
)

// heldSet is A's locks, one per key, each kept by the watchdog, with when
// it was granted and when its Lost closed.
type heldSet struct {
	rec   *Recorder
	locks map[string]*heldOne
}

type heldOne struct {
	lk        *redlease.Lock
	from      time.Duration
	lostAt    func() time.Duration
	stopWatch func()
	stopKeep  func()
	released  bool
}

// holdAll takes every key through la (lockWithin), writes each key's
// register under its fence and hands each lock to w.
func holdAll(ctx context.Context, t *testing.T, rec *Recorder, probe *redistest.StallProbe, regs redis.UniversalClient, la *redlease.Locker, w *renew.Watchdog, keys []string) *heldSet {
	t.Helper()
	h := &heldSet{rec: rec, locks: map[string]*heldOne{}}
	for _, k := range keys {
		lk := lockWithin(ctx, t, probe, la, k)
		one := &heldOne{lk: lk, from: rec.Now()}
		one.stopKeep = w.Keep(lk)
		one.lostAt, one.stopWatch = watchLost(rec, lk)
		h.locks[k] = one
		_, _ = rec.Register(regs, "register:"+k).Write(ctx, "a", lk.Fence(), 1)
	}
	return h
}

func (h *heldSet) lock(k string) *redlease.Lock { return h.locks[k].lk }

// drift is the strategy's drift allowance for ttl.
func (h *heldSet) drift(ttl time.Duration) time.Duration {
	for _, one := range h.locks {
		if d, ok := one.lk.Strategy().(redlease.DriftAllowancer); ok {
			return d.DriftAllowance(ttl)
		}
		break
	}
	return 0
}

// untils is every lock's Until now.
func (h *heldSet) untils() map[string]time.Time {
	out := map[string]time.Time{}
	for k, one := range h.locks {
		out[k] = one.lk.Until()
	}
	return out
}

// releaseAll stops keeping and watching every lock, records its hold and
// releases it (a lost lock's release is refused, harmlessly).
func (h *heldSet) releaseAll(ctx context.Context) {
	for _, k := range slices.Sorted(maps.Keys(h.locks)) {
		one := h.locks[k]
		if one.released {
			continue
		}
		one.stopWatch()
		one.stopKeep()
		lostAt := one.lostAt()
		to := min(h.rec.Now(), h.rec.At(one.lk.Until()))
		if lostAt != NeverLost {
			to = min(to, lostAt)
		}
		h.rec.AddHold(Hold{Holder: "a", Key: k, Fence: one.lk.Fence(), From: one.from, To: to, Until: h.rec.At(one.lk.Until()), LostAt: lostAt})
		_ = one.lk.Release(ctx)
		one.released = true
	}
}

// stop releases everything still held (for a scenario that ends early);
// it is a no-op after releaseAll.
func (h *heldSet) stop() { h.releaseAll(context.Background()) }

// contender is B: one goroutine trying keys through lb, one TryLock (at
// most 500 ms) after another, round robin with 2 ms between tries. A key
// it is granted is recorded (hold, register write), released at once and
// tried no more.
type contender struct {
	quit, done chan struct{}
	once       sync.Once

	mu                     sync.Mutex
	tries, held, unavailab int
	granted                map[string]bGrant
	errs                   map[string]int // unavailable errors by message (first 20 kinds)
}

// bGrant is one grant to B during the contention.
type bGrant struct {
	at    time.Duration
	fence uint64
}

func contend(ctx context.Context, rec *Recorder, regs redis.UniversalClient, lb *redlease.Locker, keys []string) *contender {
	c := &contender{quit: make(chan struct{}), done: make(chan struct{}), granted: map[string]bGrant{}, errs: map[string]int{}}
	ctx, cancel := context.WithCancel(ctx)
	go func() { <-c.quit; cancel() }()
	go func() {
		defer close(c.done)
		rest := slices.Clone(keys)
		for i := 0; i < 1_000_000 && len(rest) > 0 && ctx.Err() == nil; i++ {
			k := rest[i%len(rest)]
			tctx, tcancel := context.WithTimeout(ctx, 500*time.Millisecond)
			lk, err := lb.TryLock(tctx, k)
			tcancel()
			c.mu.Lock()
			c.tries++
			switch {
			case err == nil:
			case errors.Is(err, redlease.ErrNotObtained):
				c.held++
			case ctx.Err() == nil:
				c.unavailab++
				if msg := err.Error(); c.errs[msg] > 0 || len(c.errs) < 20 {
					c.errs[msg]++
				}
			}
			c.mu.Unlock()
			if err == nil {
				from := rec.Now()
				_, _ = rec.Register(regs, "register:"+k).Write(context.WithoutCancel(ctx), "b", lk.Fence(), 2)
				to := rec.Now()
				_ = lk.Release(context.WithoutCancel(ctx))
				rec.AddHold(Hold{Holder: "b", Key: k, Fence: lk.Fence(), From: from, To: max(to, from+time.Millisecond), Until: rec.At(lk.Until()), LostAt: NeverLost})
				c.mu.Lock()
				c.granted[k] = bGrant{at: from, fence: lk.Fence()}
				c.mu.Unlock()
				rest = slices.DeleteFunc(rest, func(x string) bool { return x == k })
				continue
			}
			sleep(ctx, 2*time.Millisecond)
		}
	}()
	return c
}

// stop ends B's tries, waits for its goroutine and summarises them. It
// may be called more than once.
func (c *contender) stop() string {
	c.once.Do(func() { close(c.quit) })
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	top, n := "", 0
	for msg, m := range c.errs {
		if m > n || (m == n && msg < top) {
			top, n = msg, m
		}
	}
	s := fmt.Sprintf("B tried %d times: %d refused as held, %d unavailable, %d granted", c.tries, c.held, c.unavailab, len(c.granted))
	if n > 0 {
		s += fmt.Sprintf(" (most common unavailable, %d×: %s)", n, top)
	}
	return s
}

// grants is a copy of B's grants so far.
func (c *contender) grants() map[string]bGrant {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]bGrant, len(c.granted))
	for k, g := range c.granted {
		out[k] = g
	}
	return out
}

// takeAfter has B take every key of keys (lockWithin), write its register
// and release it, once A let go of them all; it returns B's fence per key.
func takeAfter(ctx context.Context, t *testing.T, rec *Recorder, probe *redistest.StallProbe, regs redis.UniversalClient, lb *redlease.Locker, a *heldSet, keys []string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, k := range keys {
		lk := lockWithin(ctx, t, probe, lb, k)
		from := rec.Now()
		_, _ = rec.Register(regs, "register:"+k).Write(ctx, "b", lk.Fence(), 3)
		to := rec.Now()
		_ = lk.Release(ctx)
		rec.AddHold(Hold{Holder: "b", Key: k, Fence: lk.Fence(), From: from, To: max(to, from+time.Millisecond), Until: rec.At(lk.Until()), LostAt: NeverLost})
		out[k] = lk.Fence()
	}
	return out
}
