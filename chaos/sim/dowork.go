package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/script"
	"github.com/redlease/redlease/renew"
	"github.com/redlease/redlease/single"
)

// doLocker is one of a Do client's strategies: its Locker, the nodes its
// keys live on and the quorum of them a held key must be on.
type doLocker struct {
	name   string // key prefix: "q" (quorum), "s" (single)
	locker *redlease.Locker
	nodes  []*Node
	quorum int
}

// doLockers builds client ci's strategies for the Watchdog workload: the
// scenario's quorum over nodes 0..Nodes-1 and a single strategy on node
// Nodes, both kept by one renew.Watchdog of the client's (a process's
// watchdog keeps every strategy it is handed, in lanes per strategy).
func (w *World) doLockers(ci int, r *rand.Rand) []doLocker {
	wd, err := renew.New()
	if err != nil {
		panic(fmt.Sprintf("sim: renew.New: %v", err)) // a bug in the scenario table
	}
	w.onClose(wd.Stop)
	q := w.quorumLocker(ci, r, w.nodes[:w.sc.Nodes], redlease.WithKeeper(wd))
	sn := w.nodes[w.sc.Nodes]
	s := redlease.New(single.New(w.redisClient(ci, sn, r.IntN(2) == 0)), redlease.WithKeeper(wd))
	return []doLocker{
		{name: "q", locker: q, nodes: w.nodes[:w.sc.Nodes], quorum: w.sc.Nodes/2 + 1},
		{name: "s", locker: s, nodes: []*Node{sn}, quorum: 1},
	}
}

// doClient is one Watchdog workload client: Ops times it runs Locker.Do on
// a key of one of its strategies, with a fn that works for one to three
// TTLs (so that the watchdog must renew), stops when its ctx ends, and
// writes to the fenced register while the lock is Valid. The hold's
// belief interval runs from fn's start to the earliest of fn's return,
// Lost and Until; while Valid, a quorum of the strategy's nodes must hold
// the lock's token (held-past-expiry).
func (w *World) doClient(ci int, ls []doLocker, r *rand.Rand) {
	for seq := range w.sc.Ops {
		dl := ls[r.IntN(len(ls))]
		key := fmt.Sprintf("%s%d", dl.name, r.IntN(w.sc.Keys))
		ttl := w.drawTTL(r)
		steps := 1 + r.IntN(6)
		var pauses []time.Duration
		for range steps {
			pauses = append(pauses, time.Duration(r.Int64N(int64(ttl/2))))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		ran := false
		err := dl.locker.Do(ctx, key, func(fctx context.Context, lk *redlease.Lock) error {
			ran = true
			w.doHold(ci, seq, key, dl, lk, fctx, pauses, ttl)
			return nil
		}, redlease.WithTTL(ttl), redlease.WithRetryDelay(time.Nanosecond, time.Nanosecond), redlease.WithMaxAttempts(2+r.IntN(5)))
		cancel()
		if !ran {
			w.hist.failed()
		}
		w.hist.logf("c%d#%d do %s ttl=%v: %v", ci, seq, key, ttl, short(err))
		sleep(ms(r, 0, 30))
	}
}

// doHold is Do's fn: work in steps, check the nodes and write while Valid.
func (w *World) doHold(ci, seq int, key string, dl doLocker, lk *redlease.Lock, fctx context.Context, pauses []time.Duration, ttl time.Duration) {
	hd := &Hold{Client: ci, Seq: seq, Key: key, Via: "do", Fence: lk.Fence(), From: w.hist.now(), LostAt: -1, RelSent: -1, Strat: dl.name, Token: lk.Token(), TTL: ttl}
	w.hist.logf("c%d#%d do %s granted fence=%d until=+%.3fms", ci, seq, key, lk.Fence(), msf(time.Until(lk.Until())))
	var mu sync.Mutex
	fnDone, watched := make(chan struct{}), make(chan struct{})
	go func() { // ends with fn at the latest
		defer close(watched)
		select {
		case <-lk.Lost():
			mu.Lock()
			hd.LostAt = w.hist.now()
			mu.Unlock()
		case <-fnDone:
		}
	}()
	for _, d := range pauses {
		t := time.NewTimer(d)
		select {
		case <-fctx.Done():
			t.Stop()
		case <-t.C:
		}
		if fctx.Err() != nil {
			break
		}
		if lk.Valid() {
			w.checkHeld(ci, seq, key, dl, lk)
			w.hist.write(ci, seq, key, lk.Fence())
		}
	}
	end := w.hist.now()
	close(fnDone)
	<-watched
	hd.End = end
	if err := lk.Err(); err != nil && (errors.Is(err, script.ErrWrongType) || strings.Contains(err.Error(), "WRONGTYPE")) {
		hd.WrongType = true
	}
	hd.Until = lk.Until().Sub(w.start)
	hd.To = min(end, hd.Until)
	if hd.LostAt >= 0 {
		hd.To = min(hd.To, hd.LostAt)
	}
	w.hist.logf("c%d#%d do end %s: %s (%v)", ci, seq, key, hd, short(lk.Err()))
	w.hist.addHold(hd)
}

// checkHeld: a lock that claims validity must be on a quorum of its
// nodes under its token, read straight from the nodes (no virtual time
// passes). A node that is down counts as holding it (a durable restart
// brings it back; a restart that loses it is outside the assumptions).
func (w *World) checkHeld(ci, seq int, key string, dl doLocker, lk *redlease.Lock) {
	if dl.quorum == 0 {
		return // failover: which node must hold it depends on the failover (see checkFailover)
	}
	tok := lk.Token()
	held := 0
	for _, n := range dl.nodes {
		if n.holds(key, tok) {
			held++
		}
	}
	if held < dl.quorum {
		w.hist.violation(Violation{Inv: InvPastExpiry, At: w.hist.now(), Detail: fmt.Sprintf("c%d#%d %s: Valid for %.3fms more, but %d of %d nodes hold its token (%d needed)",
			ci, seq, key, msf(time.Until(lk.Until())), held, len(dl.nodes), dl.quorum)})
	}
}
