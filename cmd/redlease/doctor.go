package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
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
			findings := doctor(c.Context(), c.OutOrStdout(), cs, addrs, maxTTL, rule{on: nf.maxTTL > 0, durable: nf.durable})
			unsafe := 0
			for _, f := range findings {
				mark := "ok  "
				if f.unsafe {
					mark = "UNSAFE"
					unsafe++
				}
				fmt.Fprintf(c.OutOrStdout(), "%-6s %s: %s\n", mark, f.node, f.text)
			}
			if unsafe > 0 {
				return &exitError{1, fmt.Errorf("%d finding(s) unsafe for locking", unsafe)}
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&maxTTL, "ttl", 0, "the longest lock TTL in use, for the restart check (default 30s)")
	return cmd
}

// rule is how the delayed-restart rule is used (--max-ttl, --durable).
type rule struct {
	on      bool // the client enforces it
	durable bool // nodes declared to lose nothing on a restart
}

// doctor checks every node and the set, prints a table, and returns what
// it found.
func doctor(ctx context.Context, w io.Writer, cs []redis.UniversalClient, addrs []string, maxTTL time.Duration, dr rule) []finding {
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
	for i, c := range cs {
		node := addrs[i]
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		before := time.Now()
		srvTime, err := c.Time(cctx).Result()
		rtt := time.Since(before)
		if err != nil {
			cancel()
			fmt.Fprintf(tw, "%s\tno: %v\t\t\t\t\t\t\t\n", node, err)
			add(node, true, "unreachable: %v", err)
			continue
		}
		offset := srvTime.Sub(before.Add(rtt / 2))
		offsets = append(offsets, offset)
		server := infoFields(c.Info(cctx, "server").Val())
		repl := infoFields(c.Info(cctx, "replication").Val())
		aof, fsync := configValue(cctx, c, "appendonly"), configValue(cctx, c, "appendfsync")
		cancel()
		uptime, _ := strconv.Atoi(server["uptime_in_seconds"])
		fmt.Fprintf(tw, "%s\tyes\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", node, server["redis_version"], repl["role"],
			time.Duration(uptime)*time.Second, aof, fsync, repl["connected_slaves"], offset.Round(time.Millisecond))

		if repl["role"] != "master" {
			add(node, true, "is a %s: locks must be taken on primaries", repl["role"])
		}
		switch {
		case aof == "yes" && fsync == "always":
			add(node, false, "appendonly with appendfsync always: a restart keeps every lock")
		case dr.on && dr.durable:
			// RDB only: a restart brings back the last snapshot, which has the
			// boot marker but not the locks taken since. everysec: the last
			// second of writes can be lost. Either way the node would vote at
			// once after a restart that forgot locks still held elsewhere.
			add(node, true, "declared durable (--durable) but appendonly %s, appendfsync %s: a restart from a snapshot or a lost second of AOF forgets newer locks, and a durable node votes again at once; use appendfsync always, or drop --durable (every restart then sits out --max-ttl)", aof, fsync)
		case dr.on:
			add(node, false, "appendonly %s, appendfsync %s: a restart may forget locks, but every restart of this process sits out the max TTL (delayed-restart rule, run_id in the boot marker)", aof, fsync)
		case len(cs) > 1:
			add(node, true, "appendonly %s, appendfsync %s: a crash loses locks it held and it votes again at once; use appendfsync always, or --max-ttl (quorum.WithDelayedRestart)", aof, fsync)
		default:
			add(node, true, "appendonly %s, appendfsync %s: a crash loses every lock", aof, fsync)
		}
		switch {
		case time.Duration(uptime)*time.Second >= maxTTL:
		case dr.on && !dr.durable:
			add(node, false, "up only %ds, less than the max TTL %v: it does not vote until the max TTL has passed (delayed-restart rule)", uptime, maxTTL)
		default:
			add(node, true, "up only %ds, less than the max TTL %v: if it lost its data, locks it forgot may still be held elsewhere", uptime, maxTTL)
		}
		if len(cs) == 1 && repl["connected_slaves"] != "0" {
			add(node, false, "%s replica(s): use the failover strategy so grants wait for them (WAIT)", repl["connected_slaves"])
		}
	}
	_ = tw.Flush()
	if len(cs) > 1 && len(cs)%2 == 0 {
		add("set", false, "%d nodes: an even count tolerates no more failures than %d", len(cs), len(cs)-1)
	}
	if len(offsets) > 1 {
		lo, hi := offsets[0], offsets[0]
		for _, o := range offsets {
			lo, hi = min(lo, o), max(hi, o)
		}
		skew := hi - lo
		// Locks depend on clock rates, not offsets; a large offset still
		// says the clocks are not disciplined (no NTP), and then rates drift.
		add("set", skew > time.Second, "clock skew between nodes %v (TIME)", skew.Round(time.Millisecond))
	}
	return out
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
