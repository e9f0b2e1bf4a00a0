package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"

	"github.com/redlease/redlease/internal/script"
)

// nodeView is what one node says about a key.
type nodeView struct {
	Node   string `json:"node"`
	Holder string `json:"holder,omitempty"` // token prefix; "" when free
	TTLms  int64  `json:"ttl_ms,omitempty"`
	Fence  int64  `json:"fence"` // the node's fence counter for the key
	Error  string `json:"error,omitempty"`
}

// keyView is the whole picture of a key across the nodes.
type keyView struct {
	Key      string     `json:"key"`
	Nodes    []nodeView `json:"nodes"`
	Holder   string     `json:"holder,omitempty"` // token prefix held by a majority
	Agreeing int        `json:"agreeing"`         // nodes holding Holder
	Majority bool       `json:"majority"`
}

func newInspect(nf *nodeFlags) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "inspect KEY",
		Short: "Show, per node, who holds a lock, its remaining TTL and fence counter, and whether a majority agrees",
		Args:  cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			cs, closeAll, err := nf.clients()
			if err != nil {
				return err
			}
			defer closeAll()
			v := inspect(c.Context(), cs, nf.addrsOrNil(), nf.prefix+args[0])
			v.Key = args[0]
			if asJSON {
				enc := json.NewEncoder(c.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(v)
			}
			printView(c.OutOrStdout(), v)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (nf *nodeFlags) addrsOrNil() []string {
	a, _ := nf.addrs()
	return a
}

func inspect(ctx context.Context, cs []redis.UniversalClient, addrs []string, key string) keyView {
	if ctx == nil {
		ctx = context.Background()
	}
	fk, _ := script.FenceKey(key)
	v := keyView{}
	counts := map[string]int{}
	for i, c := range cs {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		nv := nodeView{Node: addrs[i]}
		pipe := c.Pipeline()
		get := pipe.Get(ctx, key)
		pttl := pipe.PTTL(ctx, key)
		fence := pipe.Get(ctx, fk)
		_, _ = pipe.Exec(ctx)
		cancel()
		switch tok, err := get.Result(); {
		case errors.Is(err, redis.Nil):
		case err != nil:
			nv.Error = err.Error()
		default:
			nv.Holder = prefix(tok)
			nv.TTLms = pttl.Val().Milliseconds()
			counts[nv.Holder]++
		}
		if f, err := fence.Int64(); err == nil {
			nv.Fence = f
		}
		v.Nodes = append(v.Nodes, nv)
	}
	for h, n := range counts {
		if n > v.Agreeing {
			v.Holder, v.Agreeing = h, n
		}
	}
	v.Majority = v.Agreeing > len(cs)/2
	return v
}

func prefix(token string) string {
	if len(token) > 8 {
		return token[:8] + "…"
	}
	return token
}

func printView(w io.Writer, v keyView) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "node\tholder\tttl\tfence counter\terror")
	for _, n := range v.Nodes {
		holder, ttl := n.Holder, ""
		if holder == "" {
			holder = "-"
		} else {
			ttl = (time.Duration(n.TTLms) * time.Millisecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", n.Node, holder, ttl, n.Fence, n.Error)
	}
	_ = tw.Flush()
	switch {
	case v.Holder == "":
		fmt.Fprintf(w, "%s: free on every node that answered\n", v.Key)
	case v.Majority:
		fmt.Fprintf(w, "%s: held by %s on %d of %d nodes (a majority)\n", v.Key, v.Holder, v.Agreeing, len(v.Nodes))
	default:
		fmt.Fprintf(w, "%s: no majority: %s on %d of %d nodes\n", v.Key, v.Holder, v.Agreeing, len(v.Nodes))
	}
	_ = os.Stdout.Sync()
}
