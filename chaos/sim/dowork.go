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

// doLocker is one of a Do client's strategies: its Locker and its key
// prefix ("q" quorum, "s" single, "c" single on the Cluster).
type doLocker struct {
	name   string
	locker *redlease.Locker
}

// doLockers builds client ci's strategies for the Watchdog workload: the
// scenario's quorum over nodes 0..Nodes-1, a single strategy on node
// Nodes and, with Cluster, a single strategy on a go-redis ClusterClient
// to the Cluster's masters, all kept by one renew.Watchdog of the
// client's (a process's watchdog keeps every strategy it is handed, in
// lanes per strategy).
func (w *World) doLockers(ci int, r *rand.Rand) []doLocker {
	wd, err := renew.New()
	if err != nil {
		panic(fmt.Sprintf("sim: renew.New: %v", err)) // a bug in the scenario table
	}
	w.onClose(ci, func() { wd.Close() })
	q := w.quorumLocker(ci, r, w.nodes[:w.sc.Nodes], redlease.WithKeeper(wd))
	sn := w.nodes[w.sc.Nodes]
	sct := r.IntN(2) == 0
	w.hist.logf("c%d single client ContextTimeoutEnabled=%v", ci, sct)
	s := must(redlease.New(must(single.New(w.redisClient(ci, sn, sct))), redlease.WithKeeper(wd), redlease.WithPolling(), redlease.WithObserver(stateObserver{w, ci})))
	ls := []doLocker{{name: "q", locker: q}, {name: "s", locker: s}}
	if w.sc.Cluster {
		c := must(redlease.New(must(single.New(w.clusterClient(ci, r.IntN(2) == 0))), redlease.WithKeeper(wd), redlease.WithPolling(), redlease.WithObserver(stateObserver{w, ci})))
		ls = append(ls, doLocker{name: "c", locker: c})
	}
	return ls
}

// holdNodes are the node ids a lock key of strategy strat lives on, and
// how many of them must hold its token: the quorum's nodes and a
// majority, the single strategy's node, or the Cluster master serving
// the key.
func (w *World) holdNodes(strat, key string) ([]int, int) {
	if w.sc.Strategy == FailoverCluster {
		return []int{w.keyHome(key).id}, 1 // the master serving it now (reshard.go: where it lives)
	}
	switch strat {
	case "s":
		return []int{w.sc.Nodes}, 1
	case "c":
		// The master the key started on: the lanes' holds all end
		// before the failover construction moves one (clusterfail.go).
		return []int{w.nodes[w.sc.clusterBase()+masterOfSlot(keySlot(key))].id}, 1
	}
	ids := make([]int, w.sc.Nodes)
	for i := range ids {
		ids[i] = i
	}
	return ids, w.sc.Nodes/2 + 1
}

// doClient is one Watchdog workload client: one goroutine per strategy
// (lane), each running Locker.Do Ops times on keys of its strategy, so
// that the client's one watchdog keeps locks of every strategy at once.
// Each lane draws from its own PCG (seeded by seed, client and lane):
// goroutines sharing one would draw in scheduler order.
func (w *World) doClient(ci int, ls []doLocker) {
	var wg sync.WaitGroup
	for li, dl := range ls {
		r := rand.New(rand.NewPCG(w.seed, uint64(ci+1)<<8|uint64(li+1)))
		wg.Go(func() { w.doLane(ci, li, len(ls), dl, r) })
	}
	wg.Wait()
}

// doLane runs Ops holds of one strategy: Locker.Do with a fn that works
// for one to three TTLs (so that the watchdog must renew), stops when its
// ctx ends, and writes to the fenced register while the lock is Valid.
// The hold's belief interval runs from fn's start to the earliest of fn's
// return, Lost and Until; while Valid, a quorum of the strategy's nodes
// must hold the lock's token (held-past-expiry).
func (w *World) doLane(ci, li, lanes int, dl doLocker, r *rand.Rand) {
	for op := range w.sc.Ops {
		seq := op*lanes + li // unique per client
		ki := r.IntN(w.sc.Keys)
		key := fmt.Sprintf("%s%d", dl.name, ki)
		if w.sc.Strategy == FailoverCluster {
			key = w.cfKey(ki)
		}
		if dl.name == "c" {
			key = clusterKeys[r.IntN(ClusterMasters)]
		}
		ttl := w.drawTTL(r)
		steps := 1 + r.IntN(6)
		var pauses []time.Duration
		for range steps {
			pauses = append(pauses, time.Duration(r.Int64N(int64(ttl/2))))
		}
		ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), ci, jitDo, seq), 3*time.Second)
		ran := false
		var fnRet time.Duration
		var strat redlease.Strategy
		err := dl.locker.Do(ctx, key, func(fctx context.Context, lk *redlease.Lock) error {
			ran = true
			w.doHold(ci, seq, key, dl, lk, fctx, pauses, ttl)
			fnRet, strat = w.hist.now(), lk.Strategy()
			return nil
		}, redlease.WithTTL(ttl), retryAtOnce(), redlease.WithMaxAttempts(2+r.IntN(5)))
		cancel()
		if !ran {
			w.hist.failed()
		} else {
			w.checkDo(ci, seq, key, strat, ttl, fnRet, false)
		}
		w.hist.logf("c%d#%d do %s ttl=%v: %v", ci, seq, key, ttl, short(err))
		sleep(ms(r, 0, 30))
	}
}

// doHold is Do's fn: work in steps, check the nodes and write while Valid.
func (w *World) doHold(ci, seq int, key string, dl doLocker, lk *redlease.Lock, fctx context.Context, pauses []time.Duration, ttl time.Duration) {
	hd := &Hold{Client: ci, Seq: seq, Key: key, Via: "do", Fence: lk.Fence(), From: w.hist.now(), LostAt: -1, RelSent: -1, Strat: dl.name, Token: lk.Token(), TTL: ttl, Until0: lk.Until().Sub(w.start)}
	ids, _ := w.holdNodes(dl.name, key)
	for _, i := range ids {
		if w.nodes[i].holds(key, hd.Token) {
			hd.HeldOn = append(hd.HeldOn, i)
		}
	}
	w.hist.logf("c%d#%d do %s granted fence=%d until=+%.3fms on nodes %v", ci, seq, key, lk.Fence(), msf(time.Until(lk.Until())), hd.HeldOn)
	live := w.track(ci, fmt.Sprintf("c%d#%d", ci, seq), key, lk, w.placeOf(dl.name, key))
	defer w.untrack(live)
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
	for step, d := range pauses {
		if !sleepCtx(fctx, d) || fctx.Err() != nil {
			break
		}
		if lk.Valid() {
			w.checkHeld(ci, seq, key, dl, lk)
			sleep(w.writePause(ci, seq, step, ttl))
			w.hist.write(ci, seq, key, lk.Fence())
		}
	}
	end := w.hist.now()
	close(fnDone)
	<-watched
	hd.End = end
	if hd.LostAt >= 0 && lk.Err() != nil {
		hd.Cause = lk.Err().Error()
	}
	if err := lk.Err(); err != nil && (errors.Is(err, script.ErrWrongType) || strings.Contains(err.Error(), "WRONGTYPE")) {
		hd.WrongType = true
	}
	hd.Until = w.untilV(ci, lk)
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
	if w.sc.Strategy == Failover || w.sc.Strategy == FailoverCluster {
		return // which node must hold it depends on the failover (see checkFailover; state-valid on the Cluster)
	}
	tok := lk.Token()
	ids, quorum := w.holdNodes(dl.name, key)
	w.hist.ex.count(InvPastExpiry, 1)
	held := 0
	for _, i := range ids {
		if w.nodes[i].holds(key, tok) {
			held++
		}
	}
	if held < quorum {
		w.hist.violation(Violation{Inv: InvPastExpiry, At: w.hist.now(), Detail: fmt.Sprintf("c%d#%d %s: Valid for %.3fms more, but %d of %d nodes hold its token (%d needed)",
			ci, seq, key, msf(time.Until(lk.Until())), held, len(ids), quorum)})
	}
}
