package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterWait bounds each wait of the Cluster helpers: topology changes on
// loopback take milliseconds, and a loaded machine gets this much slack.
const clusterWait = 15 * time.Second

// Cluster is a Redis Cluster of masters with replicas, started by
// StartClusterWithReplicas. Masters and Replicas are the roles the nodes
// were given at start; a failover (Takeover) changes the roles but not
// these fields.
type Cluster struct {
	// Masters are the masters as created, in order; they share the 16,384
	// slots as redis-cli --cluster create splits them.
	Masters []*Server
	// Replicas[i] are the replicas created for Masters[i].
	Replicas [][]*Server

	tb   TB
	ids  map[*Server]string // cluster node id of each server
	wait time.Duration      // bound of each wait; clusterWait unless a test shortens it
}

// StartClusterWithReplicas starts a Cluster of masters masters with
// replicasPer replicas each, every node a redis-server on a free loopback
// port, stopped by tb.Cleanup. It returns once every node reports
// cluster_state:ok, every replica's link to its master is up with the
// first sync done, and every node knows every replica as its master's.
func StartClusterWithReplicas(tb TB, masters, replicasPer int) *Cluster {
	tb.Helper()
	cl := &Cluster{tb: tb, Masters: StartCluster(tb, masters), Replicas: make([][]*Server, masters), ids: map[*Server]string{}, wait: clusterWait}
	ctx := context.Background()
	for _, m := range cl.Masters {
		cl.ids[m] = nodeID(tb, m)
	}
	for i, m := range cl.Masters {
		for range replicasPer {
			r := startClusterNode(tb)
			cl.ids[r] = nodeID(tb, r)
			c := redis.NewClient(&redis.Options{Addr: r.Addr})
			if err := c.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(m.Port)).Err(); err != nil {
				tb.Fatalf("redistest: CLUSTER MEET from %s to %s: %v", r.Addr, m.Addr, err)
			}
			// REPLICATE needs the master known to the new node first.
			cl.waitFor(func() bool {
				nodes, err := c.ClusterNodes(ctx).Result()
				return err == nil && strings.Contains(nodes, cl.ids[m])
			}, "replica %s to learn master %s (%s) through CLUSTER MEET", r.Addr, m.Addr, cl.ids[m])
			if err := c.Do(ctx, "CLUSTER", "REPLICATE", cl.ids[m]).Err(); err != nil {
				tb.Fatalf("redistest: CLUSTER REPLICATE %s on %s: %v", m.Addr, r.Addr, err)
			}
			_ = c.Close()
			cl.Replicas[i] = append(cl.Replicas[i], r)
		}
	}
	for i, m := range cl.Masters {
		for _, r := range cl.Replicas[i] {
			cl.waitLinked(m, r)
		}
	}
	all := cl.Servers()
	for i, m := range cl.Masters {
		for _, r := range cl.Replicas[i] {
			want := cl.ids[r] + " "
			cl.waitFor(func() bool {
				for _, s := range all {
					line := nodeLine(ctx, s, cl.ids[r])
					if !strings.HasPrefix(line, want) || !strings.Contains(line, "slave "+cl.ids[m]) {
						return false
					}
				}
				return true
			}, "every node to list %s as replica of %s", r.Addr, m.Addr)
		}
	}
	for _, s := range all {
		waitClusterOK(tb, s)
	}
	return cl
}

// Servers returns every node, masters first, then the replicas in the
// order of their masters.
func (cl *Cluster) Servers() []*Server {
	out := append([]*Server{}, cl.Masters...)
	for _, rs := range cl.Replicas {
		out = append(out, rs...)
	}
	return out
}

// Client returns a Cluster client that knows every node (ClusterClient).
func (cl *Cluster) Client() *redis.ClusterClient { return ClusterClient(cl.tb, cl.Servers()) }

// Server returns the node at addr, nil if none of the cluster's is.
func (cl *Cluster) Server(addr string) *Server {
	for _, s := range cl.Servers() {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// MasterOf returns the node cc routes key to now, failing tb if it is
// not one of the cluster's.
func (cl *Cluster) MasterOf(ctx context.Context, cc *redis.ClusterClient, key string) *Server {
	cl.tb.Helper()
	m, err := cc.MasterForKey(ctx, key)
	if err != nil {
		cl.tb.Fatalf("redistest: master for %q: %v", key, err)
	}
	s := cl.Server(m.Options().Addr)
	if s == nil {
		cl.tb.Fatalf("redistest: master for %q is %s, not a node of this cluster", key, m.Options().Addr)
	}
	return s
}

// ReplicaOf returns the first replica created for master (one of Masters).
func (cl *Cluster) ReplicaOf(master *Server) *Server {
	cl.tb.Helper()
	for i, m := range cl.Masters {
		if m == master && len(cl.Replicas[i]) > 0 {
			return cl.Replicas[i][0]
		}
	}
	cl.tb.Fatalf("redistest: %s is not a master created with a replica", master.Addr)
	return nil
}

// StopReplication puts replica behind its master, in an order that
// nothing can reorder: it sets credentials the master refuses for the
// replica's next handshake (masteruser/masterauth of a user that does not
// exist), then closes the replica's link (CLIENT KILL TYPE master on the
// replica). A link closed by the replica drops whatever it had not read
// yet, and every reconnection fails at AUTH, so from the moment it returns
// no write on the master reaches the replica until ResumeReplication. It
// returns once the replica reports its link down and the master does not
// list it, and fails tb if that takes longer than the helpers' wait.
func (cl *Cluster) StopReplication(master, replica *Server) {
	cl.tb.Helper()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer c.Close()
	for _, kv := range [][2]string{{"masteruser", "redistest-nobody"}, {"masterauth", "redistest-refused"}} {
		if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			cl.tb.Fatalf("redistest: CONFIG SET %s on replica %s: %v", kv[0], replica.Addr, err)
		}
	}
	if err := c.Do(ctx, "CLIENT", "KILL", "TYPE", "master").Err(); err != nil {
		cl.tb.Fatalf("redistest: CLIENT KILL TYPE master on replica %s: %v", replica.Addr, err)
	}
	cl.waitFor(func() bool {
		return infoField(ctx, replica, "replication", "master_link_status") == "down" && !listsReplica(ctx, master, replica)
	}, "replica %s to report its link down and master %s to stop listing it", replica.Addr, master.Addr)
}

// ResumeReplication undoes StopReplication: the replica's next handshake
// succeeds. It returns once the link is up and the replica has caught up
// with the master's replication offset at the time of the call.
func (cl *Cluster) ResumeReplication(master, replica *Server) {
	cl.tb.Helper()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer c.Close()
	for _, k := range []string{"masteruser", "masterauth"} {
		if err := c.ConfigSet(ctx, k, "").Err(); err != nil {
			cl.tb.Fatalf("redistest: CONFIG SET %s on replica %s: %v", k, replica.Addr, err)
		}
	}
	target := replOffset(ctx, cl.tb, master)
	cl.waitFor(func() bool {
		off, err := strconv.ParseInt(infoField(ctx, replica, "replication", "master_repl_offset"), 10, 64)
		return infoField(ctx, replica, "replication", "master_link_status") == "up" && err == nil && off >= target
	}, "replica %s to relink to %s and reach offset %d", replica.Addr, master.Addr, target)
}

// Lag returns how many bytes of the master's replication stream the
// replica has not processed: master_repl_offset on the master less the
// replica's.
func (cl *Cluster) Lag(master, replica *Server) int64 {
	cl.tb.Helper()
	ctx := context.Background()
	return replOffset(ctx, cl.tb, master) - replOffset(ctx, cl.tb, replica)
}

// Takeover promotes replica with CLUSTER FAILOVER TAKEOVER: it claims its
// master's slots at once, without the master's agreement or the other
// masters' votes, whatever its replication offset. It returns when the
// TAKEOVER command returned (the promotion: the replica is a master from
// then on), after checking that the replica reports role master and
// waiting until cc routes key to it (ReloadState, then MasterForKey), so
// that the next command cc sends for key goes to the new master. Each wait
// fails tb after the helpers' bound.
func (cl *Cluster) Takeover(replica *Server, cc *redis.ClusterClient, key string) time.Time {
	cl.tb.Helper()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer c.Close()
	if err := c.Do(ctx, "CLUSTER", "FAILOVER", "TAKEOVER").Err(); err != nil {
		cl.tb.Fatalf("redistest: CLUSTER FAILOVER TAKEOVER on %s: %v", replica.Addr, err)
	}
	promoted := time.Now()
	if role := infoField(ctx, replica, "replication", "role"); role != "master" {
		cl.tb.Fatalf("redistest: %s reports role %q right after TAKEOVER, want master", replica.Addr, role)
	}
	cl.WaitRoute(cc, key, replica)
	return promoted
}

// WaitRoute waits until cc routes key to s, asking it to reload the slot
// map (ReloadState, which reloads in the background) at every try.
func (cl *Cluster) WaitRoute(cc *redis.ClusterClient, key string, s *Server) {
	cl.tb.Helper()
	ctx := context.Background()
	last := ""
	cl.waitFor(func() bool {
		cc.ReloadState(ctx)
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			last = err.Error()
			return false
		}
		last = m.Options().Addr
		return last == s.Addr
	}, "the Cluster client to route %q to %s (it routes to %s)", key, s.Addr, Lazy(func() string { return last }))
}

// ReadOnlyGet reads key on s as a Cluster replica serves reads (READONLY,
// then GET, on one connection): redis.Nil when s does not have it. On a
// master it is a plain GET.
func (s *Server) ReadOnlyGet(ctx context.Context, key string) (string, error) {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	conn := c.Conn()
	defer conn.Close()
	if err := conn.ReadOnly(ctx).Err(); err != nil {
		return "", err
	}
	return conn.Get(ctx, key).Result()
}

// waitFor polls cond every 5 ms until it holds, and fails tb after
// cl.wait with what it waited for.
func (cl *Cluster) waitFor(cond func() bool, what string, args ...any) {
	cl.tb.Helper()
	deadline := time.Now().Add(cl.wait)
	for !cond() {
		if time.Now().After(deadline) {
			cl.tb.Fatalf("redistest: waited %v for %s", cl.wait, fmt.Sprintf(what, args...))
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitLinked waits until replica's link to master is up and its first
// sync done, as both sides see it.
func (cl *Cluster) waitLinked(master, replica *Server) {
	cl.tb.Helper()
	ctx := context.Background()
	cl.waitFor(func() bool {
		return infoField(ctx, replica, "replication", "master_link_status") == "up" &&
			infoField(ctx, replica, "replication", "master_sync_in_progress") == "0" &&
			listsReplica(ctx, master, replica)
	}, "replica %s to link to master %s (master_link_status:up, sync done, listed online by the master)", replica.Addr, master.Addr)
}

// nodeID is s's cluster node id (CLUSTER MYID).
func nodeID(tb TB, s *Server) string {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	id, err := c.Do(context.Background(), "CLUSTER", "MYID").Text()
	if err != nil {
		tb.Fatalf("redistest: CLUSTER MYID on %s: %v", s.Addr, err)
	}
	return id
}

// nodeLine is the CLUSTER NODES line of node id as s sees it, "" if s
// does not know it or cannot answer.
func nodeLine(ctx context.Context, s *Server, id string) string {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	nodes, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(nodes, "\n") {
		if strings.HasPrefix(line, id+" ") {
			return line
		}
	}
	return ""
}

// infoField is field of INFO section on s, "" if s does not answer or has
// no such field.
func infoField(ctx context.Context, s *Server, section, field string) string {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	info, err := c.Info(ctx, section).Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// listsReplica reports whether master lists replica online among its
// replicas (INFO replication's slaveN lines name them by listening port).
func listsReplica(ctx context.Context, master, replica *Server) bool {
	c := redis.NewClient(&redis.Options{Addr: master.Addr})
	defer c.Close()
	info, err := c.Info(ctx, "replication").Result()
	if err != nil {
		return false
	}
	return strings.Contains(info, ",port="+strconv.Itoa(replica.Port)+",state=online")
}

// replOffset is s's master_repl_offset (on a replica: how much of its
// master's stream it has processed).
func replOffset(ctx context.Context, tb TB, s *Server) int64 {
	tb.Helper()
	v := infoField(ctx, s, "replication", "master_repl_offset")
	off, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		tb.Fatalf("redistest: master_repl_offset of %s: %q: %v", s.Addr, v, err)
	}
	return off
}

// HalfMigrate leaves slot half migrated from src to dst, as a resharding
// interrupted midway does: dst IMPORTING it, src MIGRATING it, keys moved
// to dst (MIGRATE), and the slot's other keys left on src. Clients asking
// src for a moved key get ASK; a command on several of the slot's keys,
// some moved, gets TRYAGAIN. It fails tb if a step is refused.
func HalfMigrate(tb TB, src, dst *Server, slot int, keys ...string) {
	tb.Helper()
	ctx := context.Background()
	srcID, dstID := nodeID(tb, src), nodeID(tb, dst)
	s, d := redis.NewClient(&redis.Options{Addr: src.Addr}), redis.NewClient(&redis.Options{Addr: dst.Addr})
	defer s.Close()
	defer d.Close()
	if err := d.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		tb.Fatalf("redistest: CLUSTER SETSLOT %d IMPORTING on %s: %v", slot, dst.Addr, err)
	}
	if err := s.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		tb.Fatalf("redistest: CLUSTER SETSLOT %d MIGRATING on %s: %v", slot, src.Addr, err)
	}
	if len(keys) == 0 {
		return
	}
	args := []any{"MIGRATE", "127.0.0.1", dst.Port, "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	if err := s.Do(ctx, args...).Err(); err != nil {
		tb.Fatalf("redistest: MIGRATE %v from %s to %s: %v", keys, src.Addr, dst.Addr, err)
	}
}
