package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/redlease/redlease/internal/script"
)

// inspectTimeout bounds the question to each node.
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
			addrs, err := nf.dataNodes(c.Context())
			if err != nil {
				return err
			}
			cs, closeAll, err := nf.connect(addrs)
			if err != nil {
				return err
			}
			defer closeAll()
			v := inspect(c.Context(), cs, addrs, nf.prefix+args[0])
			v.Key = args[0]
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
			if v.State == "unavailable" {
				return &exitError{exitUnavailable, fmt.Errorf("%s: only %d of %d nodes answered, %d needed to tell free from held",
					v.Key, v.Answered, len(v.Nodes), v.Needed)}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// inspect asks every node at once.
func inspect(ctx context.Context, cs []redis.UniversalClient, addrs []string, key string) keyView {
	if ctx == nil {
		ctx = context.Background()
	}
	fk, _ := script.FenceKey(key)
	hk := holderKey(key)
	v := keyView{RedisKey: key, Nodes: make([]nodeView, len(cs)), Needed: len(cs)/2 + 1}
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Go(func() { v.Nodes[i] = inspectNode(ctx, c, addrs[i], key, fk, hk) })
	}
	wg.Wait()
	counts := map[string]int{}
	free := 0
	for _, n := range v.Nodes {
		switch n.State {
		case "held":
			v.Answered++
			counts[n.Token]++
		case "free":
			v.Answered++
			free++
		}
	}
	for tok, n := range counts {
		if n > v.Agreeing || (n == v.Agreeing && tok < v.Token) {
			v.Token, v.Agreeing = tok, n
		}
	}
	for _, n := range v.Nodes {
		if n.Token == v.Token && n.Holder != nil {
			v.Holder = n.Holder
			break
		}
	}
	v.Majority = v.Agreeing >= v.Needed
	switch {
	case v.Majority:
		v.State = "held"
	case free >= v.Needed:
		v.State = "free"
	case v.Answered < v.Needed:
		v.State = "unavailable"
	default:
		v.State = "split"
	}
	return v
}

func inspectNode(ctx context.Context, c redis.UniversalClient, addr, key, fk, hk string) nodeView {
	ctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	nv := nodeView{Node: addr}
	pipe := c.Pipeline()
	get := pipe.Get(ctx, key)
	pttl := pipe.PTTL(ctx, key)
	fence := pipe.Get(ctx, fk)
	meta := pipe.HMGet(ctx, hk, "token", "host", "pid", "start", "command", "fence") // HMGET: in docs/redis-acl.conf
	_, _ = pipe.Exec(ctx)
	switch tok, err := get.Result(); {
	case errors.Is(err, redis.Nil):
		nv.State = "free"
	case err != nil:
		nv.State, nv.Error = "error", err.Error()
		return nv
	default:
		nv.State, nv.Token = "held", tok
		nv.TTLms = pttl.Val().Milliseconds()
		m := make([]string, 6)
		for i, x := range meta.Val() {
			m[i], _ = x.(string)
		}
		if m[0] == tok {
			pid, _ := strconv.Atoi(m[2])
			f, _ := strconv.ParseUint(m[5], 10, 64)
			nv.Holder = &holder{Token: tok, Host: m[1], PID: pid, Start: m[3], Command: m[4], Fence: f}
		}
	}
	if f, err := fence.Int64(); err == nil {
		nv.Fence = f
	}
	return nv
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
