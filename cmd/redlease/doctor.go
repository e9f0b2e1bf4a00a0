package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/single"
)

// finding is one thing doctor says about a node or the set.
type finding struct {
	node   string
	unsafe bool
	text   string
}

func newDoctor(nf *nodeFlags) *cobra.Command {
	var maxTTL time.Duration
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Check each node for what makes locking unsafe, and say why; exit 1 if anything is",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, args []string) error {
			if maxTTL < 0 {
				return &exitError{exitUsage, fmt.Errorf("--ttl %v: must not be negative", maxTTL)}
			}
			addrs, err := nf.dataNodes(c.Context())
			if err != nil {
				return err
			}
			cs, closeAll, err := nf.connect(addrs)
			if err != nil {
				return err
			}
			defer closeAll()
			if maxTTL == 0 {
				maxTTL = 30 * time.Second
			}
			out := &outWriter{w: c.OutOrStdout()}
			findings := doctor(c.Context(), out, cs, addrs, maxTTL, rule{on: nf.maxTTL > 0, durable: nf.durable, maxTTL: nf.maxTTL}, nf.prefix)
			unsafe := 0
			for _, f := range findings {
				mark := "ok  "
				if f.unsafe {
					mark = "UNSAFE"
					unsafe++
				}
				fmt.Fprintf(out, "%-6s %s: %s\n", mark, f.node, f.text)
			}
			if err := out.check(); err != nil {
				return err
			}
			if unsafe > 0 {
				return &exitError{exitUnsafe, fmt.Errorf("%d finding(s) unsafe for locking", unsafe)}
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&maxTTL, "ttl", 0, "the longest lock TTL in use, for the restart check (default 30s)")
	return cmd
}

// rule is how the delayed-restart rule is used (--max-ttl, --durable).
type rule struct {
	on      bool          // the client enforces it
	durable bool          // nodes declared to lose nothing on a restart
	maxTTL  time.Duration // --max-ttl
}

// doctor checks every node and the set, prints a table, and returns what
// it found.
func doctor(ctx context.Context, w io.Writer, cs []redis.UniversalClient, addrs []string, maxTTL time.Duration, dr rule, prefix string) []finding {
	if ctx == nil {
		ctx = context.Background()
	}
	var out []finding
	add := func(node string, unsafe bool, format string, args ...any) {
		out = append(out, finding{node, unsafe, fmt.Sprintf(format, args...)})
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "node\treachable\tversion\trole\tuptime\tappendonly\tappendfsync\treplicas\tclock offset")
	var offsets []time.Duration
	seenAddr := map[string]bool{}
	seenRunID := map[string]string{} // run_id -> first node that reported it
	if dr.on && maxTTL > dr.maxTTL {
		add("set", true, "the TTL in use (--ttl %v) exceeds --max-ttl %v: a restarted node sits out only %v, and votes again while a lock it forgot may still be valid; raise --max-ttl to at least %v, or use shorter TTLs", maxTTL, dr.maxTTL, dr.maxTTL, maxTTL)
	}
	for i, c := range cs {
		node := addrs[i]
		if seenAddr[node] {
			add(node, true, "listed twice: one server counted as two nodes breaks the majority; list each node once")
			continue
		}
		seenAddr[node] = true
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		before := time.Now()
		srvTime, err := c.Time(cctx).Result()
		rtt := time.Since(before)
		if err != nil {
			cancel()
			fmt.Fprintf(tw, "%s\tno: %v\t\t\t\t\t\t\t\n", node, err)
			add(node, true, "unreachable: %v; check that redis-server runs there and the address, or remove it from --nodes", err)
			continue
		}
		offset := srvTime.Sub(before.Add(rtt / 2))
		offsets = append(offsets, offset)
		server := infoFields(c.Info(cctx, "server").Val())
		repl := infoFields(c.Info(cctx, "replication").Val())
		aof, fsync := configValue(cctx, c, "appendonly"), configValue(cctx, c, "appendfsync")
		save, policy, maxmem := configValue(cctx, c, "save"), configValue(cctx, c, "maxmemory-policy"), configValue(cctx, c, "maxmemory")
		probeErr := probe(cctx, c, prefix)
		cancel()
		if id := server["run_id"]; id != "" {
			if first, ok := seenRunID[id]; ok {
				add(node, true, "the same server as %s (run_id %s): one server counted as two nodes breaks the majority; list each node once", first, id)
			} else {
				seenRunID[id] = node
			}
		}
		switch {
		case strings.HasPrefix(policy, "allkeys-"):
			add(node, true, "maxmemory-policy %s: under memory pressure Redis evicts lock keys and fence counters, and a held lock can be granted again; set maxmemory-policy noeviction", policy)
		case strings.HasPrefix(policy, "volatile-") && maxmem != "0":
			add(node, true, "maxmemory-policy %s with maxmemory %s: under memory pressure Redis evicts keys with a TTL, lock keys first among them; set maxmemory-policy noeviction", policy, maxmem)
		case strings.HasPrefix(policy, "unknown"):
			add(node, false, "maxmemory-policy %s: cannot tell whether lock keys can be evicted; it must be noeviction", policy)
		}
		if probeErr != nil {
			add(node, true, "a probe lock under %q failed: %v; grant the user the rights in docs/redis-acl.conf (the lock prefix, redlease:*, EVAL/EVALSHA and the commands the scripts call)", prefix, probeErr)
		}
		uptime, _ := strconv.Atoi(server["uptime_in_seconds"])
		fmt.Fprintf(tw, "%s\tyes\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", node, server["redis_version"], repl["role"],
			time.Duration(uptime)*time.Second, aof, fsync, repl["connected_slaves"], offset.Round(time.Millisecond))

		if repl["role"] != "master" {
			add(node, true, "is a %s: locks must be taken on primaries", repl["role"])
		}
		persistence := fmt.Sprintf("appendonly %s, appendfsync %s", aof, fsync)
		if aof != "yes" && save != "" && !strings.HasPrefix(save, "unknown") {
			persistence = fmt.Sprintf("RDB snapshots only (save %q, appendonly %s)", save, aof)
		}
		switch {
		case aof == "yes" && fsync == "always":
			add(node, false, "appendonly with appendfsync always: a restart keeps every lock")
		case dr.on && dr.durable:
			// RDB only: a restart brings back the last snapshot, which has the
			// boot marker but not the locks taken since. everysec: the last
			// second of writes can be lost. Either way the node would vote at
			// once after a restart that forgot locks still held elsewhere.
			add(node, true, "declared durable (--durable) but %s: a restart from a snapshot or a lost second of AOF forgets newer locks, and a durable node votes again at once; use appendonly yes + appendfsync always, or drop --durable (every restart then sits out --max-ttl)", persistence)
		case dr.on:
			add(node, false, "%s: a restart may forget locks, but every restart of this process sits out the max TTL (delayed-restart rule, run_id in the boot marker)", persistence)
		case len(cs) > 1:
			add(node, true, "%s: a crash loses locks it held and it votes again at once; use appendonly yes + appendfsync always, or --max-ttl (quorum.WithDelayedRestart)", persistence)
		default:
			add(node, true, "%s: a crash loses every lock; use appendonly yes + appendfsync always", persistence)
		}
		switch {
		case time.Duration(uptime)*time.Second >= maxTTL:
		case dr.on && !dr.durable:
			add(node, false, "up only %ds, less than the max TTL %v: it does not vote until the max TTL has passed (delayed-restart rule)", uptime, maxTTL)
		default:
			add(node, true, "up only %ds, less than the max TTL %v: if it lost its data, locks it forgot may still be held elsewhere; use --max-ttl (the delayed-restart rule), or wait %v before using it", uptime, maxTTL, maxTTL-time.Duration(uptime)*time.Second)
		}
		if len(cs) == 1 && repl["connected_slaves"] != "0" {
			add(node, false, "%s replica(s): use the failover strategy so grants wait for them (WAIT)", repl["connected_slaves"])
		}
	}
	_ = tw.Flush()
	if len(cs) > 1 && len(cs)%2 == 0 {
		add("set", false, "%d nodes: an even count tolerates no more failures than %d; use an odd count", len(cs), len(cs)-1)
	}
	if len(offsets) > 1 {
		out = append(out, skewFinding(offsets))
	}
	return out
}

// skewFinding judges the spread of the nodes' clock offsets (two or more).
// Locks depend on clock rates, not offsets; a large offset still says the
// clocks are not disciplined (no NTP), and then rates drift.
func skewFinding(offsets []time.Duration) finding {
	lo, hi := offsets[0], offsets[0]
	for _, o := range offsets {
		lo, hi = min(lo, o), max(hi, o)
	}
	skew := (hi - lo).Round(time.Millisecond)
	if skew > time.Second {
		return finding{"set", true, fmt.Sprintf("clock skew between nodes %v (TIME): their clocks are not disciplined, and then their rates drift too; run NTP on every node", skew)}
	}
	return finding{"set", false, fmt.Sprintf("clock skew between nodes %v (TIME)", skew)}
}

func infoFields(info string) map[string]string {
	m := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			m[k] = v
		}
	}
	return m
}

// configValue reads a setting, or says why it could not (a locked-down
// user may not run CONFIG GET).
func configValue(ctx context.Context, c redis.UniversalClient, name string) string {
	v, err := c.ConfigGet(ctx, name).Result()
	if err != nil {
		return "unknown (" + strings.SplitN(err.Error(), " ", 2)[0] + ")"
	}
	return v[name]
}

// probe takes and releases a lock under prefix on one node, as the single
// strategy does: a user without the rights the scripts need fails here
// (NOPERM) rather than on the first real lock. Its lock name is new on
// every run (the process id), so its fence counter expires with the lock's
// TTL (probeTTL) rather than the default fence TTL: a run leaves nothing
// behind for longer than that.
func probe(ctx context.Context, c redis.UniversalClient, prefix string) error {
	s, err := single.New(c, single.WithFenceTTL(probeTTL))
	if err != nil {
		return err
	}
	l, err := redlease.New(s, redlease.WithPrefix(prefix), redlease.WithTTL(probeTTL))
	if err != nil {
		return err
	}
	lk, err := l.TryLock(ctx, "redlease-doctor-probe-"+strconv.Itoa(os.Getpid()))
	switch {
	case err == nil:
		return lk.Release(ctx)
	case strings.Contains(err.Error(), "NOPERM"), strings.Contains(err.Error(), "NOSCRIPT"):
		return err
	}
	return nil // held (by another doctor?) or a node trouble reported above
}

// probeTTL is the probe lock's TTL and its fence counter's.
const probeTTL = 5 * time.Second
