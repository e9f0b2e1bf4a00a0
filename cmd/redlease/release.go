package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/redlease/redlease"
)

func newRelease(nf *nodeFlags) *cobra.Command {
	var (
		force bool
		yes   bool
		token string
	)
	cmd := &cobra.Command{
		Use:   "release --force KEY",
		Short: "Revoke another holder's lock: delete KEY where it still holds the token inspect shows, after confirmation",
		Long: `release --force inspects KEY as inspect does and shows it; if a majority
holds it under one token (or --token names one), it asks for confirmation on
the terminal (unless --yes), then deletes KEY on every node where it still
holds that token, and nowhere else: if the key changed hands since it was
shown, release says so and deletes nothing. Waiters are woken; the fence
counter is left alone, so the next holder's fence is above the revoked one's.

The revoked holder is not told. It goes on until its next renewal finds the
key gone (a third of its TTL at most, by default; redlease run then stops its
command and exits 76) or its validity runs out, while a waiter may take the
key at once: until then two holders can act, and only fences keep storage
safe. Revoke a holder that is stuck or gone, not one that is working.

It exits 0 once the token is deleted where it held the key and can no longer
hold a majority; 1 when nothing was released (declined, the key free or
split without --token, or no longer held by that token); 69 when too few
nodes answered.`,
		Args: cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if !force {
				return &exitError{exitUsage, errors.New("release ends another holder's lock: give --force (a lock is released by its holder; run releases its own)")}
			}
			op, err := nf.operator(c.Context())
			if err != nil {
				return err
			}
			defer op.stop()
			ctx, key := c.Context(), args[0]
			if ctx == nil {
				ctx = context.Background()
			}
			v, err := op.inspect(ctx, key)
			if err != nil {
				return err
			}
			out := &outWriter{w: c.OutOrStdout()}
			printView(out, v)
			if err := out.check(); err != nil {
				return err
			}
			if err := unavailable(v); err != nil {
				return err
			}
			if token == "" {
				if v.State != string(redlease.KeyHeld) {
					return &exitError{exitNotReleased, fmt.Errorf("%s: %s, held by no token on a majority: nothing released (--token TOKEN removes a particular one)", key, v.State)}
				}
				token = v.Token
			}
			if !yes && !confirm(c.InOrStdin(), c.ErrOrStderr(), v, token) {
				return &exitError{exitNotReleased, fmt.Errorf("%s: not confirmed: nothing released", key)}
			}
			r, err := op.locker.ForceRelease(ctx, key, token)
			if len(r.Nodes) > 0 {
				printForced(out, r)
			}
			switch {
			case err == nil:
				fmt.Fprintf(out, "%s: released %s on %d of %d nodes; its holder learns at its next renewal, and its fence is now stale\n",
					key, short(token), r.Deleted, len(r.Nodes))
				return out.check()
			case errors.Is(err, redlease.ErrNotHeld) && len(r.Nodes) > 0:
				if now, err := op.inspect(ctx, key); err == nil {
					fmt.Fprint(out, "now: ")
					printSummary(out, now)
				}
				if err := out.check(); err != nil {
					return err
				}
				return &exitError{exitNotReleased, fmt.Errorf("%s: no node that answered holds %s any more (it changed hands, was released or expired since it was shown): nothing deleted", key, short(token))}
			case errors.Is(err, redlease.ErrDenied):
				return deniedExit(fmt.Sprintf("release %q", key), err)
			case errors.Is(err, redlease.ErrUnavailable):
				return &exitError{exitUnavailable, redlease.Wrap(fmt.Errorf("release %q", key), err)}
			case errors.Is(err, redlease.ErrInvalid):
				return &exitError{exitUsage, err}
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "end another holder's lock (required)")
	cmd.Flags().BoolVarP(&yes, "yes", "y", false, "do not ask for confirmation")
	cmd.Flags().StringVar(&token, "token", "", "the token to delete (default: the one a majority holds, as shown)")
	return cmd
}

// confirm asks on w, and reads the answer from r: only "y" or "yes"
// confirms; anything else, or no answer (end of input), declines.
func confirm(r io.Reader, w io.Writer, v keyView, token string) bool {
	who := "no holder record"
	if h := v.Holder; h != nil && h.Token == token {
		who = fmt.Sprintf("host %s, pid %d, since %s, command %q", h.Host, h.PID, h.Start, h.Command)
	}
	fmt.Fprintf(w, "redlease: release %s held by %s (%s)? Its holder is not told before its next renewal and may still act until then; only fences stop its writes. [y/N] ",
		v.Key, short(token), who)
	line, _ := bufio.NewReader(r).ReadString('\n')
	fmt.Fprintln(w)
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	return false
}

// printForced prints what each node did.
func printForced(w io.Writer, r redlease.ForceResult) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "node\trelease")
	for _, n := range r.Nodes {
		what := "deleted"
		switch {
		case n.Err != nil:
			what = "error: " + n.Err.Error()
		case !n.Deleted:
			what = "not held by " + short(r.Token) + ": left alone"
		}
		fmt.Fprintf(tw, "%s\t%s\n", n.Addr, what)
	}
	_ = tw.Flush()
}
