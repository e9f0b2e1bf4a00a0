package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/chaos/internal/faultproxy"
	"github.com/redlease/redlease/internal/redistest"
)

// Nodes is a set of independent redis-server processes, each reachable
// through one in-process proxy per client group, so a fault can cut one
// group off from a node while another group still reaches it.
type Nodes struct {
	tb      redistest.TB
	Servers []*redistest.Server

	mu      sync.Mutex
	proxies map[string][]*faultproxy.Proxy // group → one proxy per node
}

// StartNodes starts n servers with cfg (Persist for nodes that keep their
// data across a restart). They and their proxies stop on cleanup.
func StartNodes(tb redistest.TB, n int, cfg redistest.Config) *Nodes {
	tb.Helper()
	return &Nodes{tb: tb, Servers: redistest.StartN(tb, n, cfg), proxies: map[string][]*faultproxy.Proxy{}}
}

// Group returns the proxies of a client group, one per node, made on first
// use.
func (ns *Nodes) Group(name string) []*faultproxy.Proxy {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if p, ok := ns.proxies[name]; ok {
		return p
	}
	ps := make([]*faultproxy.Proxy, len(ns.Servers))
	for i, s := range ns.Servers {
		ps[i] = faultproxy.New(ns.tb, s.Addr)
	}
	ns.proxies[name] = ps
	return ps
}

// Clients returns one client per node for a group, through its proxies.
// Clients have ContextTimeoutEnabled, short dial and read timeouts (a fault
// must not hold a request for go-redis's default 3 s), and no retries (a
// retry of an ambiguous write is itself a fault scenario, chosen
// explicitly where wanted).
func (ns *Nodes) Clients(group string) []redis.UniversalClient {
	ps := ns.Group(group)
	out := make([]redis.UniversalClient, len(ps))
	for i, p := range ps {
		c := redis.NewClient(&redis.Options{
			Addr: p.Addr, ContextTimeoutEnabled: true, MaxRetries: -1,
			DialTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond,
		})
		ns.tb.Cleanup(func() { _ = c.Close() })
		out[i] = c
	}
	return out
}

// Direct returns a client to node i that bypasses every proxy, for
// inspecting keys.
func (ns *Nodes) Direct(i int) *redis.Client { return ns.Servers[i].Client() }

// Cut cuts group off from the given nodes (connections refused, as for a
// crashed node, but only for this group).
func (ns *Nodes) Cut(group string, nodes ...int) {
	for _, i := range nodes {
		ns.Group(group)[i].Cut()
	}
}

// Silence makes the given nodes hold group's requests without an answer:
// the silent partition, the realistic one.
func (ns *Nodes) Silence(group string, nodes ...int) {
	for _, i := range nodes {
		ns.Group(group)[i].Silence("silence")
	}
}

// Heal removes every fault between group and the given nodes.
func (ns *Nodes) Heal(group string, nodes ...int) {
	for _, i := range nodes {
		ns.Group(group)[i].Heal()
	}
}

// StrayKeys counts keys matching pattern on every live node (direct
// connections). Call it after the longest TTL has passed: a lock key still
// there is a stray.
func (ns *Nodes) StrayKeys(ctx context.Context, pattern string) int {
	n := 0
	for i, s := range ns.Servers {
		if !s.Alive() {
			continue
		}
		keys, err := ns.Direct(i).Keys(ctx, pattern).Result()
		if err != nil {
			continue
		}
		for _, k := range keys {
			if !strings.HasPrefix(k, redlease.ReservedPrefix) { // fence counters and boot markers have no TTL, by design
				n++
			}
		}
	}
	return n
}

// SentinelGroup is a primary, one replica whose replication link runs
// through a proxy (so it can be black-holed), and three Sentinels.
type SentinelGroup struct {
	Master    string
	Primary   *redistest.Server
	Replica   *redistest.Server
	Link      *faultproxy.Proxy // replica → primary replication traffic
	Sentinels []*redistest.Sentinel
	// Front, when not nil, is the proxy through which the Sentinels and
	// their clients reach the first primary (StartIsolatableGroup), so the
	// primary can be cut off from them while a direct client still reaches
	// it: a split brain.
	Front *faultproxy.Proxy
}

// StartSentinelGroup starts the group and waits until the Sentinels know
// the replica. downAfter is Sentinel's down-after-milliseconds.
func StartSentinelGroup(tb redistest.TB, master string, downAfter time.Duration) *SentinelGroup {
	tb.Helper()
	g := &SentinelGroup{Master: master, Primary: redistest.Start(tb, redistest.Config{})}
	g.Link = faultproxy.New(tb, g.Primary.Addr)
	// The replica replicates through the proxy; it announces its own port.
	g.Replica = redistest.StartReplicaVia(tb, g.Primary, g.Link.Addr, redistest.Config{})
	g.Sentinels = redistest.StartSentinels(tb, g.Primary, master, 3, 2, downAfter)
	g.waitForReplica(tb)
	return g
}

// StartIsolatableGroup is StartSentinelGroup with the Sentinels (and every
// client that asks them) reaching the primary through Front.
func StartIsolatableGroup(tb redistest.TB, master string, downAfter time.Duration) *SentinelGroup {
	tb.Helper()
	g := &SentinelGroup{Master: master, Primary: redistest.Start(tb, redistest.Config{})}
	g.Link = faultproxy.New(tb, g.Primary.Addr)
	g.Front = faultproxy.New(tb, g.Primary.Addr)
	g.Replica = redistest.StartReplicaVia(tb, g.Primary, g.Link.Addr, redistest.Config{})
	g.Sentinels = redistest.StartSentinelsAt(tb, g.Front.Addr, master, 3, 2, downAfter)
	g.waitForReplica(tb)
	return g
}

func (g *SentinelGroup) waitForReplica(tb redistest.TB) {
	tb.Helper()
	sc := redis.NewSentinelClient(&redis.Options{Addr: g.Sentinels[0].Addr})
	defer sc.Close()
	for range 300 {
		reps, err := sc.Replicas(context.Background(), g.Master).Result()
		if err == nil && len(reps) == 1 && !strings.Contains(reps[0]["flags"], "down") {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatalf("chaos: Sentinel never saw the replica of %s", g.Master)
}

// Client returns a failover client that follows the primary through the
// Sentinels.
func (g *SentinelGroup) Client(tb redistest.TB) *redis.Client {
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName: g.Master, SentinelAddrs: redistest.Addrs(g.Sentinels),
		ContextTimeoutEnabled: true, MaxRetries: -1,
		DialTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond,
	})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// SentinelClients returns one client per Sentinel.
func (g *SentinelGroup) SentinelClients(tb redistest.TB) []*redis.SentinelClient {
	out := make([]*redis.SentinelClient, len(g.Sentinels))
	for i, s := range g.Sentinels {
		out[i] = s.Client(tb)
	}
	return out
}

// PrimaryAddr asks the first Sentinel that answers where the primary is.
func (g *SentinelGroup) PrimaryAddr(ctx context.Context, tb redistest.TB) (string, error) {
	for _, sc := range g.SentinelClients(tb) {
		a, err := sc.GetMasterAddrByName(ctx, g.Master).Result()
		if err == nil && len(a) == 2 {
			return a[0] + ":" + a[1], nil
		}
	}
	return "", fmt.Errorf("no Sentinel knows %s", g.Master)
}

// WaitForNewPrimary waits (bounded) until the failover away from old is
// over, and returns the new primary. Over means: every Sentinel that
// answers names the same primary other than old, none of them reports a
// failover in progress, and that primary says role:master. One Sentinel
// naming a new address is not enough: Sentinel answers
// GET-MASTER-ADDR-BY-NAME with the promoted replica while the failover is
// still running, and a failover can still be aborted then.
//
// Then it makes this failover the last one: every Sentinel's
// down-after-milliseconds goes up to a minute, so that Sentinels slowed by
// a loaded machine cannot declare the new primary down and fail over a
// second time (back to the old primary, which may not have finished its
// resync yet and so still holds its old keys). A scenario grades one
// failover; a second, spurious one would change the world it grades.
func (g *SentinelGroup) WaitForNewPrimary(ctx context.Context, tb redistest.TB, old string, within time.Duration) (string, error) {
	deadline := time.Now().Add(within)
	scs := g.SentinelClients(tb)
	var last string
	for time.Now().Before(deadline) {
		if addr, why := g.failedOver(ctx, scs, old); why == "" {
			for _, sc := range scs {
				if err := sc.Set(ctx, g.Master, "down-after-milliseconds", "60000").Err(); err != nil {
					return "", fmt.Errorf("freeze Sentinel config: %w", err)
				}
			}
			return addr, nil
		} else {
			last = why
		}
		time.Sleep(20 * time.Millisecond)
	}
	return "", fmt.Errorf("the failover away from %s did not complete within %v: %s", old, within, last)
}

// failedOver returns the new primary if the failover away from old is
// complete (see WaitForNewPrimary), or why not.
func (g *SentinelGroup) failedOver(ctx context.Context, scs []*redis.SentinelClient, old string) (addr, why string) {
	for _, sc := range scs {
		a, err := sc.GetMasterAddrByName(ctx, g.Master).Result()
		if err != nil || len(a) != 2 {
			continue // a Sentinel down or slow does not decide
		}
		got := a[0] + ":" + a[1]
		switch {
		case got == old:
			return "", "a Sentinel still names " + old
		case addr != "" && got != addr:
			return "", fmt.Sprintf("Sentinels disagree: %s and %s", addr, got)
		}
		addr = got
		m, err := sc.Master(ctx, g.Master).Result()
		if err != nil {
			return "", "SENTINEL MASTER: " + err.Error()
		}
		if strings.Contains(m["flags"], "failover_in_progress") {
			return "", "failover in progress"
		}
	}
	if addr == "" {
		return "", "no Sentinel answered"
	}
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return "", "new primary: " + err.Error()
	}
	if !strings.Contains(info, "role:master") {
		return "", addr + " is not a master yet"
	}
	return addr, ""
}
