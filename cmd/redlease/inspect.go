package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// inspectTimeout is how long inspect and release wait for each node at
// least, on several nodes (the quorum's node timeout, unless
// --node-timeout is longer); one node gets the single strategy's call
// bound, redlease.DefaultCallBound.
const inspectTimeout = 2 * time.Second

// nodeView is what one node says about a key.
type nodeView struct {
	Node   string  `json:"node"`
	State  string  `json:"state"`            // "held", "free" or "error"
	Token  string  `json:"token,omitempty"`  // the lock's value, in full
	TTLms  int64   `json:"ttl_ms,omitempty"` // the lock key's remaining TTL
	Fence  int64   `json:"fence"`            // the node's fence counter for the key
	Holder *holder `json:"holder,omitempty"` // run's metadata, when it names Token
	Error  string  `json:"error,omitempty"`
}

// keyView is the whole picture of a key across the nodes.
type keyView struct {
	Key      string     `json:"key"`
	RedisKey string     `json:"redis_key"` // with the prefix
	State    string     `json:"state"`     // "held", "free", "split" (no majority either way) or "unavailable"
	Nodes    []nodeView `json:"nodes"`
	Answered int        `json:"answered"`         // nodes that answered
	Needed   int        `json:"needed"`           // a majority of the nodes
	Token    string     `json:"token,omitempty"`  // the token most nodes hold
	Holder   *holder    `json:"holder,omitempty"` // its metadata, from any node that has it
	Agreeing int        `json:"agreeing"`         // nodes holding Token
	Majority bool       `json:"majority"`         // Agreeing is a majority of all nodes
}

func newInspect(nf *nodeFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect KEY",
		Short: "Show, per node, who holds a lock (token, host, pid, command), its remaining TTL and fence counter, and whether a majority agrees",
		Long: `inspect asks every node (with --strategy failover, the primary the Sentinels
name) about KEY at once and says whether it is held (and by whom: run stores
host, pid, start time and command beside its grant), free, or split. It exits
69 (unavailable) when no majority of the nodes answered, 0 otherwise.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			op, err := nf.operator(c.Context())
			if err != nil {
				return err
			}
			defer op.stop()
			v, err := op.inspect(c.Context(), args[0])
			if err != nil {
				return err
			}
			out := &outWriter{w: c.OutOrStdout()}
			if asJSON {
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				enc.SetEscapeHTML(false)
				_ = enc.Encode(v) // keyView always encodes; out keeps a write error
			} else {
				printView(out, v)
			}
			if err := out.check(); err != nil {
				return err
			}
			return unavailable(v)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// unavailable is inspect's exit for a view too few nodes answered (69),
// or nil.
func unavailable(v keyView) error {
	if v.State != string(redlease.KeyUnavailable) {
		return nil
	}
	return &exitError{exitUnavailable, fmt.Errorf("%s: only %d of %d nodes answered, %d needed to tell free from held",
		v.Key, v.Answered, len(v.Nodes), v.Needed)}
}

// operator is what inspect and release work through: a Locker with the
// CLI's prefix on the data nodes (--nodes, or with --strategy failover
// the primary the Sentinels name): the single strategy on one node, the
// quorum strategy on several, whatever --strategy says, since a read or
// a compare-and-delete is the same on every strategy of one node.
type operator struct {
	locker *redlease.Locker
	prefix string
	stop   func()
}

// operator connects to the data nodes.
func (nf *nodeFlags) operator(ctx context.Context) (*operator, error) {
	addrs, err := nf.dataNodes(ctx)
	if err != nil {
		return nil, err
	}
	cs, closeAll, err := nf.connect(addrs)
	if err != nil {
		return nil, err
	}
	var s redlease.Strategy
	stop := closeAll
	if len(cs) == 1 {
		s, err = single.New(cs[0])
	} else {
		// Each node gets inspectTimeout at least: the default node
		// timeout (100 ms) is a grant's, too short for an operator's look
		// on a busy node.
		var q *quorum.Strategy
		q, err = quorum.New(cs, quorum.WithFencing(), quorum.WithNodeTimeout(max(nf.timeout, inspectTimeout)))
		if q != nil {
			s, stop = q, func() { _ = q.Close(); closeAll() }
		}
	}
	if err != nil {
		closeAll()
		return nil, &exitError{exitUsage, err}
	}
	l, err := redlease.New(s, redlease.WithPrefix(nf.prefix))
	if err != nil {
		stop()
		return nil, &exitError{exitUsage, err}
	}
	return &operator{locker: l, prefix: nf.prefix, stop: stop}, nil
}

// inspect asks every node at once (Locker.Inspect) and returns the view
// inspect prints; an error is one no view shows (a bad key: 64).
func (op *operator) inspect(ctx context.Context, key string) (keyView, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	in, err := op.locker.Inspect(ctx, key)
	if in.State == "" { // no view: the call was refused
		if errors.Is(err, redlease.ErrInvalid) {
			return keyView{}, &exitError{exitUsage, err}
		}
		return keyView{}, err
	}
	return viewOf(in, op.prefix+key), nil
}

// viewOf is inspect's view of an Inspection of redisKey.
func viewOf(in redlease.Inspection, redisKey string) keyView {
	v := keyView{
		Key: in.Key, RedisKey: redisKey, State: string(in.State), Nodes: make([]nodeView, len(in.Nodes)),
		Answered: in.Answered, Needed: in.Quorum, Token: in.Token, Holder: holderOf(in.Holder),
		Agreeing: in.Holding, Majority: in.Holding >= in.Quorum,
	}
	for i, n := range in.Nodes {
		v.Nodes[i] = nodeViewOf(n)
	}
	return v
}

// nodeViewOf is inspect's view of one node's.
func nodeViewOf(n redlease.NodeView) nodeView {
	switch {
	case n.Err != nil:
		return nodeView{Node: n.Addr, State: "error", Error: n.Err.Error()}
	case n.Held:
		return nodeView{Node: n.Addr, State: "held", Token: n.Token, TTLms: n.TTL.Milliseconds(), Fence: int64(n.Fence), Holder: holderOf(n.Holder)}
	}
	return nodeView{Node: n.Addr, State: "free", Fence: int64(n.Fence)}
}

// holderOf is the CLI's holder of a record, or nil.
func holderOf(r *redlease.HolderRecord) *holder {
	if r == nil {
		return nil
	}
	h := &holder{Token: r.Token, Host: r.Host, PID: r.PID, Command: r.Command, Fence: r.Fence}
	if !r.Since.IsZero() {
		h.Start = r.Since.UTC().Format(time.RFC3339Nano)
	}
	return h
}

// short abbreviates a token for the table.
func short(token string) string {
	if len(token) > 8 {
		return token[:8] + "…"
	}
	return token
}

func printView(w io.Writer, v keyView) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "node\tstate\ttoken\tttl\tfence counter\tholder\terror")
	for _, n := range v.Nodes {
		tok, ttl, who := "-", "", ""
		if n.State == "held" {
			tok, ttl = short(n.Token), (time.Duration(n.TTLms) * time.Millisecond).String()
		}
		if n.Holder != nil {
			who = fmt.Sprintf("%s pid %d", n.Holder.Host, n.Holder.PID)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\n", n.Node, n.State, tok, ttl, n.Fence, who, n.Error)
	}
	_ = tw.Flush()
	printSummary(w, v)
}

// printSummary prints the verdict's line (and the holder's, when held).
func printSummary(w io.Writer, v keyView) {
	switch v.State {
	case "held":
		fmt.Fprintf(w, "%s: held by %s on %d of %d nodes (a majority)\n", v.Key, short(v.Token), v.Agreeing, len(v.Nodes))
		if h := v.Holder; h != nil {
			fmt.Fprintf(w, "holder: host %s, pid %d, since %s, command %q\n", h.Host, h.PID, h.Start, h.Command)
		} else {
			fmt.Fprintln(w, "holder: not recorded (taken by a library client, not by redlease run)")
		}
	case "free":
		free := 0
		for _, n := range v.Nodes {
			if n.State == "free" {
				free++
			}
		}
		fmt.Fprintf(w, "%s: free on %d of %d nodes (a majority)\n", v.Key, free, len(v.Nodes))
	case "unavailable":
		fmt.Fprintf(w, "%s: unavailable: %d of %d nodes answered, %d needed\n", v.Key, v.Answered, len(v.Nodes), v.Needed)
	default:
		fmt.Fprintf(w, "%s: no majority either way: %s on %d of %d nodes\n", v.Key, short(v.Token), v.Agreeing, len(v.Nodes))
	}
}
