package primary

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Cluster master that fails over. go-redis reloads a ClusterClient's
// topology by itself only on MOVED, ASK and READONLY, which a dead master
// never sends, and every ClusterStateReloadInterval (60 s by default):
// without help, renewals would go on to the dead master, and a lock its
// promoted replica holds would be lost for want of a renewal sent there.
// So a call that a master left without a reply (a dead, silent or paused
// master, not an error it answered) asks go-redis for a reload, and marks
// the master silent until a call on one of its keys is answered. In a
// batch of renewals, the pipeline of a master marked silent waits, at most
// maxAwaitMove and half of its own wait, for a reload to place its keys
// elsewhere, asking again every awaitMoveStep; then it is sent where the
// topology says. The other masters' pipelines do not wait for it. A master
// that was only paused keeps its keys, and their first renewal after it
// is that much later.

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
	if p.cluster == nil || !unanswered(err) {
		return
	}
	p.cluster.ReloadState(context.Background())
}

// unanswered reports whether err is a call's failure that no server
// answered (not nil, not an error reply such as NOPERM or BUSY).
func unanswered(err error) bool {
	var reply redis.Error
	return err != nil && !errors.As(err, &reply)
}

// markSilent records that master addr left a call without a reply (err),
// and asks for a reload. An error the master answered marks nothing.
func (p *Primary) markSilent(addr string, err error) {
	if p.cluster == nil || !unanswered(err) {
		return
	}
	p.silentMu.Lock()
	if p.silent == nil {
		p.silent = map[string]time.Time{}
	}
	p.silent[addr] = time.Now()
	p.silentN.Store(int32(len(p.silent)))
	p.silentMu.Unlock()
	p.cluster.ReloadState(context.Background())
}

// answered clears master addr's silence.
func (p *Primary) answered(addr string) {
	if p.silentN.Load() == 0 {
		return
	}
	p.silentMu.Lock()
	delete(p.silent, addr)
	p.silentN.Store(int32(len(p.silent)))
	p.silentMu.Unlock()
}

// heard clears the silence of key's master when a call on key was
// answered (err is nil or an error the server sent).
func (p *Primary) heard(ctx context.Context, key string, err error) {
	if p.cluster == nil || p.silentN.Load() == 0 || unanswered(err) {
		return
	}
	if m, merr := p.cluster.MasterForKey(ctx, key); merr == nil {
		p.answered(m.Options().Addr)
	}
}

// silentMasters returns the masters marked silent within silentMemory, or
// nil.
func (p *Primary) silentMasters() map[string]bool {
	if p.silentN.Load() == 0 {
		return nil
	}
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
	p.silentN.Store(int32(len(p.silent)))
	return out
}

// awaitMove waits, at most limit, until the topology places key on
// another master than addr, asking go-redis for a reload every
// awaitMoveStep meanwhile. It returns when ctx ends too.
func (p *Primary) awaitMove(ctx context.Context, key, addr string, limit time.Duration) {
	if limit <= 0 {
		return
	}
	p.awaitRoute(ctx, key, limit, func(m *redis.Client, err error) bool { return err != nil || m.Options().Addr != addr })
}

// awaitRoute waits, at most limit and while ctx lasts, until done accepts
// the route the topology gives key (its master, or the error), asking
// go-redis for a reload every awaitMoveStep meanwhile. It returns the
// master done accepted, nil if it accepted an error or the wait ended.
func (p *Primary) awaitRoute(ctx context.Context, key string, limit time.Duration, done func(*redis.Client, error) bool) *redis.Client {
	end := time.Now().Add(limit)
	t := time.NewTicker(awaitMoveStep)
	defer t.Stop()
	for {
		m, err := p.cluster.MasterForKey(ctx, key)
		if done(m, err) {
			if err != nil {
				return nil
			}
			return m
		}
		if !time.Now().Before(end) {
			return nil
		}
		p.cluster.ReloadState(context.Background())
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// shardLookup bounds Shard's look at the topology: go-redis answers from
// its last topology, and loads one only if it never did.
const shardLookup = 100 * time.Millisecond

// Shard names the Cluster master that serves key by the client's last
// known topology, or "" (not a Cluster client, or no topology within
// shardLookup). See redlease.Sharder.
func (p *Primary) Shard(key string) string {
	if p.cluster == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), shardLookup)
	defer cancel()
	m, err := p.cluster.MasterForKey(ctx, key)
	if err != nil {
		return ""
	}
	return m.Options().Addr
}
