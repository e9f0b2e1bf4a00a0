package primary

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
)

// A Cluster master that fails over. go-redis reloads a ClusterClient's
// topology by itself only on MOVED, ASK and READONLY, which a dead master
// never sends, and every ClusterStateReloadInterval (60 s by default):
// without help, renewals would go on to the dead master, and a lock its
// promoted replica holds would be lost for want of a renewal sent there.
// So a call that a master left without a reply (a dead, silent or paused
// master, not an error it answered) asks go-redis for a reload, and marks
// the master silent until it answers again. A later batch of renewals
// whose keys the topology still places on a silent master waits, at most
// maxAwaitMove and half of its own wait, for a reload to place them
// elsewhere, asking again every awaitMoveStep; then it sends them where
// the topology says. A master that was only paused keeps its keys, and
// their renewals are that much later.

// maxAwaitMove is the longest a batch waits for the topology to move keys
// off a silent master; awaitMoveStep how often it looks.
const (
	maxAwaitMove  = 500 * time.Millisecond
	awaitMoveStep = 10 * time.Millisecond
)

// silentMemory is how long a master stays marked silent without a call
// that tells otherwise.
const silentMemory = time.Minute

// reloadOnSilence asks a Cluster client to reload its topology (in the
// background, one reload at a time, 200 ms apart: go-redis's LazyReload)
// when a call failed without a reply from a server.
func (p *Primary) reloadOnSilence(err error) {
	if p.cluster == nil || err == nil {
		return
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return
	}
	p.cluster.ReloadState(context.Background())
}

// markSilent records that master addr left a call without a reply (err),
// and asks for a reload. An error the master answered marks nothing.
func (p *Primary) markSilent(addr string, err error) {
	if p.cluster == nil || err == nil {
		return
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return
	}
	p.silentMu.Lock()
	if p.silent == nil {
		p.silent = map[string]time.Time{}
	}
	p.silent[addr] = time.Now()
	p.silentMu.Unlock()
	p.cluster.ReloadState(context.Background())
}

// answered clears master addr's silence.
func (p *Primary) answered(addr string) {
	p.silentMu.Lock()
	delete(p.silent, addr)
	p.silentMu.Unlock()
}

// silentMasters returns the masters marked silent within silentMemory, or
// nil.
func (p *Primary) silentMasters() map[string]bool {
	p.silentMu.Lock()
	defer p.silentMu.Unlock()
	var out map[string]bool
	for addr, at := range p.silent {
		if time.Since(at) > silentMemory {
			delete(p.silent, addr)
			continue
		}
		if out == nil {
			out = map[string]bool{}
		}
		out[addr] = true
	}
	return out
}

// awaitMoves waits, at most limit, until the topology places none of
// items' valid keys on a silent master, asking go-redis for a reload
// every awaitMoveStep meanwhile. It returns at once when no key is on a
// silent master, and when ctx ends.
func (p *Primary) awaitMoves(ctx context.Context, items []redlease.Extension, valid []int, limit time.Duration) {
	silent := p.silentMasters()
	if len(silent) == 0 || limit <= 0 {
		return
	}
	onSilent := func() bool {
		for _, i := range valid {
			m, err := p.cluster.MasterForKey(ctx, items[i].Key)
			if err == nil && silent[m.Options().Addr] {
				return true
			}
		}
		return false
	}
	if !onSilent() {
		return
	}
	end := time.Now().Add(limit)
	t := time.NewTicker(awaitMoveStep)
	defer t.Stop()
	for {
		p.cluster.ReloadState(context.Background())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !onSilent() || !time.Now().Before(end) {
			return
		}
	}
}
