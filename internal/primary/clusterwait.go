package primary

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease/internal/script"
)

// Replicated writes on a Redis Cluster (Config.AllReplicas: the failover
// strategy on a Cluster client). WAIT counts the replicas of the
// connection's server that acknowledged what that connection wrote, so a
// write and its WAIT go out in one pipeline on the key's master's own
// client (go-redis's MasterForKey), never through the Cluster client,
// which would send WAIT to a node of its choosing. That client follows no
// redirection by itself, so the call does: MOVED (the slot has a new
// master: a failover or a finished migration) reloads the topology and
// sends the call again to the master named; ASK (the slot is migrating
// and the key is already on the importing master) sends it there after
// ASKING; TRYAGAIN (a multi-key call on a slot half migrated) waits a
// little and tries again. All of it within ctx, and at most maxRedirects
// times.
//
// WAIT's count is every replica that the master's shard lists in CLUSTER
// SHARDS, whatever its health, and at least Config.Replicas: a Cluster
// may promote any replica of a failed master, so a grant that one of them
// did not acknowledge could be lost by a failover, and the lock granted
// again. A shard whose replica is down therefore grants nothing (the
// write is refused as not replicated: ErrUnavailable) until the replica
// is back or removed from the cluster (CLUSTER FORGET). A shard that lists
// no replica waits for none: its master cannot fail over. The counts are
// asked of the master itself, at most every replicaCountAge, and again
// after a WAIT that fell short.

// maxRedirects bounds the MOVED, ASK and TRYAGAIN answers one call
// follows.
const maxRedirects = 5

// replicaCountAge is how long a master's count of replicas is used
// before CLUSTER SHARDS is asked again.
const replicaCountAge = time.Second

// tryAgainStep is the first wait after TRYAGAIN; each next one doubles.
const tryAgainStep = 10 * time.Millisecond

// replicaCounts caches, per master address, how many replicas its shard
// lists, as that master itself says (its own view of its replicas, not
// another node's gossip).
type replicaCounts struct {
	mu sync.Mutex
	n  map[string]replicaCount
}

// replicaCount is one master's count, when it was read, and the read
// under way, if any (loading closes when it ends).
type replicaCount struct {
	n       int
	read    bool      // n was read once
	at      time.Time // zero: read again before use
	loading chan struct{}
}

// waits reports whether writes wait for replicas: a required count
// (failover on one primary) or, on a Cluster client, AllReplicas.
func (p *Primary) waits() bool {
	return p.cfg.Replicas > 0 || (p.cluster != nil && p.cfg.AllReplicas)
}

// replicasOf returns how many replicas must acknowledge a write on
// master m: every replica its shard lists, and at least Config.Replicas.
func (p *Primary) replicasOf(ctx context.Context, m *redis.Client) (int, error) {
	addr := m.Options().Addr
	rc := &p.replicas
	for {
		rc.mu.Lock()
		if rc.n == nil {
			rc.n = map[string]replicaCount{}
		}
		c := rc.n[addr]
		known := c.read
		if !c.at.IsZero() && time.Since(c.at) < replicaCountAge {
			rc.mu.Unlock()
			return max(c.n, p.cfg.Replicas), nil
		}
		if ch := c.loading; ch != nil {
			rc.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return 0, context.Cause(ctx)
			}
		}
		ch := make(chan struct{})
		c.loading = ch
		rc.n[addr] = c
		rc.mu.Unlock()
		n, err := shardReplicas(ctx, m, addr)
		rc.mu.Lock()
		c = rc.n[addr]
		c.loading = nil
		if err == nil {
			c.n, c.read, c.at = n, true, time.Now()
		}
		rc.n[addr] = c
		close(ch)
		rc.mu.Unlock()
		if err != nil {
			if known { // the last count stands until one can be read
				return max(c.n, p.cfg.Replicas), nil
			}
			return 0, fmt.Errorf("replicas of %s: %w", addr, err)
		}
	}
}

// forgetReplicaCounts makes the next write on each master read its count
// again (a WAIT fell short: a replica may have been removed).
func (p *Primary) forgetReplicaCounts() {
	p.replicas.mu.Lock()
	for addr, c := range p.replicas.n {
		c.at = time.Time{}
		p.replicas.n[addr] = c
	}
	p.replicas.mu.Unlock()
}

// shardReplicas asks master m (at addr) for CLUSTER SHARDS and returns
// the number of replicas in its own shard, whatever their health.
func shardReplicas(ctx context.Context, m *redis.Client, addr string) (int, error) {
	shards, err := m.ClusterShards(ctx).Result()
	if err != nil {
		return 0, err
	}
	for _, sh := range shards {
		replicas, mine := 0, false
		for _, n := range sh.Nodes {
			switch n.Role {
			case "master":
				mine = mine || slices.Contains(nodeAddrs(n), addr)
			case "replica":
				replicas++
			}
		}
		if mine {
			return replicas, nil
		}
	}
	return 0, errors.New("CLUSTER SHARDS does not list it as a master")
}

// nodeAddrs is every address a client may know node n by: its IP, endpoint
// and hostname, each with its port and its TLS port.
func nodeAddrs(n redis.Node) []string {
	var out []string
	for _, host := range []string{n.IP, n.Endpoint, n.Hostname} {
		if host == "" || host == "?" {
			continue
		}
		for _, port := range []int64{n.Port, n.TLSPort} {
			if port > 0 {
				out = append(out, net.JoinHostPort(host, strconv.FormatInt(port, 10)))
			}
		}
	}
	return out
}

// redirection is a Cluster node's answer that the call belongs elsewhere.
type redirection struct {
	kind string // "MOVED", "ASK" or "TRYAGAIN"
	addr string // where to, for MOVED and ASK
}

// redirected reads err as a redirection; ok is false for anything else.
func redirected(err error) (r redirection, ok bool) {
	var reply redis.Error
	if err == nil || !errors.As(err, &reply) {
		return r, false
	}
	f := strings.Fields(reply.Error())
	switch {
	case len(f) == 3 && (f[0] == "MOVED" || f[0] == "ASK"):
		return redirection{kind: f[0], addr: f[2]}, true
	case len(f) > 0 && f[0] == "TRYAGAIN":
		return redirection{kind: f[0]}, true
	}
	return r, false
}

// onMaster sends line, a call of sc on key, to key's master, followed in
// the same pipeline by WAIT for the master's replicas (replicasOf), and
// follows the redirections it meets (see the top of this file). It returns
// the call's reply, and repl, an error that errors.Is ErrNotReplicated, if
// the call was answered and too few replicas acknowledged it. err is set
// when the call itself failed (the reply's error, or the pipeline's).
func (p *Primary) onMaster(ctx context.Context, sc *script.Script, key string, line []any) (cmd *redis.Cmd, repl, err error) {
	node, err := p.cluster.MasterForKey(ctx, key)
	if err != nil {
		return nil, nil, err
	}
	p.remember(node)
	asking, loaded := false, false
	for attempt := 0; ; attempt++ {
		n, err := p.replicasOf(ctx, node)
		if err != nil {
			return nil, nil, err
		}
		pipe := node.Pipeline()
		if asking {
			pipe.Do(ctx, "ASKING")
		}
		cmd = pipe.Do(ctx, line...)
		var wait *redis.Cmd
		if n > 0 {
			wait = pipe.Do(ctx, "WAIT", n, p.cfg.WaitTimeout.Milliseconds())
		}
		_, execErr := pipe.Exec(ctx) // errors are read per command
		if cmd.Err() == nil && cmd.Val() == nil && execErr != nil {
			return nil, nil, execErr // no reply: a connection that could not be set up
		}
		err = cmd.Err()
		if script.IsNoScript(err) && !loaded {
			loaded = true
			if err := sc.Load(ctx, node); err != nil {
				return nil, nil, err
			}
			continue
		}
		r, ok := redirected(err)
		if !ok || attempt >= maxRedirects {
			if err != nil {
				return cmd, nil, err
			}
			if wait != nil {
				if repl = p.replicatedN(wait, n); repl != nil {
					p.forgetReplicaCounts()
				}
			}
			return cmd, repl, nil
		}
		switch r.kind {
		case "MOVED":
			p.cluster.ReloadState(ctx)
			if node, err = p.masterAt(ctx, key, r.addr); err != nil {
				return cmd, nil, err
			}
			asking = false
		case "ASK":
			if node, err = p.masterAt(ctx, "", r.addr); err != nil {
				return cmd, nil, err
			}
			asking = true
		case "TRYAGAIN":
			t := time.NewTimer(tryAgainStep << attempt)
			select {
			case <-t.C:
			case <-ctx.Done():
				// ctx's end, with the last reply: a bounded call
				// reports it as abandoned, as when the caller saw
				// the end first (bounded.Call).
				t.Stop()
				return cmd, nil, fmt.Errorf("%w (the last reply: %w)", context.Cause(ctx), err)
			}
		}
	}
}

// masterAt returns the Cluster client's client of the master at addr: the
// node client go-redis made for addr, if this Primary saw it (remember;
// go-redis makes a client for every node its topology names, replicas
// included, so a promoted replica's is usually known). Else, if key is
// set (MOVED), the one the reloaded topology routes key to once it routes
// it to addr, waiting at most maxAwaitMove; else the master of that
// address among the topology's.
func (p *Primary) masterAt(ctx context.Context, key, addr string) (*redis.Client, error) {
	if c, ok := p.nodes.Load(addr); ok {
		return c.(*redis.Client), nil
	}
	if key != "" {
		routed := p.awaitRoute(ctx, key, maxAwaitMove, func(m *redis.Client, err error) bool { return err == nil && m.Options().Addr == addr })
		if routed != nil {
			p.remember(routed)
			return routed, nil
		}
		if err := ctx.Err(); err != nil {
			return nil, context.Cause(ctx)
		}
	}
	var (
		mu    sync.Mutex
		found *redis.Client
	)
	err := p.cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		p.remember(c)
		if c.Options().Addr == addr {
			mu.Lock()
			found = c
			mu.Unlock()
		}
		return nil
	})
	if found != nil {
		return found, nil
	}
	if err == nil {
		err = fmt.Errorf("redirected to %s, which the Cluster client does not know as a master", addr)
	}
	return nil, err
}

// remember records node client c by its address, for masterAt.
func (p *Primary) remember(c *redis.Client) {
	p.nodes.Store(c.Options().Addr, c)
}
