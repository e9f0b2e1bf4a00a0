package quorum

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/bounded"
	"github.com/redlease/redlease/internal/fanout"
	"github.com/redlease/redlease/internal/inspect"
	"github.com/redlease/redlease/internal/script"
)

var (
	_ redlease.Inspector     = (*Strategy)(nil)
	_ redlease.ForceReleaser = (*Strategy)(nil)
)

// Inspect asks every node at once what it holds for key (one script per
// node that writes nothing: token, remaining TTL, fence counter, fair-mode
// waiters) and judges the answers against a majority of the nodes (see
// redlease.Inspector). It returns within the node timeout or ctx,
// whichever ends first, whatever the clients' options; a node that has
// not answered by then is reported with its timeout. A node known to be
// another node's server (the same run_id, see New) is not asked: its
// answer would count that server twice.
func (s *Strategy) Inspect(ctx context.Context, key string) (redlease.Inspection, error) {
	if err := script.CheckKey(key); err != nil {
		return redlease.Inspection{}, err
	}
	views, errs := inspect.Survey(ctx, s.surveyed(), s.nodeTimeout, func(ctx context.Context, c redis.UniversalClient) (redlease.NodeView, error) {
		return inspect.Read(ctx, c, key)
	})
	for i := range views {
		views[i].Node, views[i].Addr, views[i].Err = i, s.addrs[i], errs[i]
	}
	return inspect.Judge(ctx, key, views, s.quorum)
}

// ForceRelease deletes key on every node where it holds token, and
// publishes its release notice there (the release script, as a holder's
// release), asking every node at once and waiting for each within the
// node timeout or ctx, whichever ends first, whatever the clients'
// options; every node's outcome is reported (see
// redlease.ForceReleaser). Unlike Release, it does not return at a
// quorum: an operator is told what each node did.
func (s *Strategy) ForceRelease(ctx context.Context, key, token string) (redlease.ForceResult, error) {
	if err := script.CheckKey(key); err != nil {
		return redlease.ForceResult{}, err
	}
	if token == "" {
		return redlease.ForceResult{}, redlease.Invalid("empty token")
	}
	line := script.ReleaseArgs(key, token)
	vals, errs := inspect.Survey(ctx, s.surveyed(), s.nodeTimeout, func(ctx context.Context, c redis.UniversalClient) (int64, error) {
		return script.Release.Run(ctx, c, line)
	})
	deleted := make([]bool, len(vals))
	for i, v := range vals {
		deleted[i] = v == 1
	}
	return inspect.Forced(ctx, key, token, s.addrs, deleted, errs, s.quorum)
}

// surveyed is the nodes as Inspect and ForceRelease ask them: none after
// Close (fanout.ErrClosed), and a node known to be another's server
// excluded.
func (s *Strategy) surveyed() []inspect.Node {
	dup := *s.dup.Load()
	ns := make([]inspect.Node, len(s.nodes))
	for i, c := range s.nodes {
		ns[i] = inspect.Node{Client: c, Honors: bounded.HonorsContext(c)}
		switch {
		case s.fan.Closed():
			ns[i].Excluded = fanout.ErrClosed
		case dup[i] >= 0:
			ns[i].Excluded = errSameServer{of: dup[i]}
		}
	}
	return ns
}
