package primary

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/inspect"
	"github.com/redlease/redlease/internal/script"
)

// Inspect reads what the primary holds for key (script.Inspect, one round
// trip that writes nothing) and judges it (see redlease.Inspector), within
// redlease.DefaultCallBound or ctx, whichever ends first, whatever the
// client's options (it waits for no replica: no WAIT timeout to add).
func (p *Primary) Inspect(ctx context.Context, key string) (redlease.Inspection, error) {
	if err := script.CheckKey(key); err != nil {
		return redlease.Inspection{}, err
	}
	views, errs := inspect.Survey(ctx, p.node(), redlease.DefaultCallBound, func(ctx context.Context, c redis.UniversalClient) (redlease.NodeView, error) {
		return inspect.Read(ctx, c, key)
	})
	p.heard(ctx, key, errs[0])
	if errs[0] != nil {
		p.reloadOnSilence(errs[0])
	}
	views[0].Addr, views[0].Err = p.addrOf(ctx, key), errs[0]
	return inspect.Judge(ctx, key, views, 1)
}

// ForceRelease deletes key where it holds token and publishes its release
// notice (script.Release, as a holder's release), within
// redlease.DefaultCallBound or ctx, whichever ends first, whatever the
// client's options (see redlease.ForceReleaser). Like Release, it does
// not wait for replicas.
func (p *Primary) ForceRelease(ctx context.Context, key, token string) (redlease.ForceResult, error) {
	if err := script.CheckKey(key); err != nil {
		return redlease.ForceResult{}, err
	}
	if token == "" {
		return redlease.ForceResult{}, redlease.Invalid("empty token")
	}
	line := script.ReleaseArgs(key, token)
	vals, errs := inspect.Survey(ctx, p.node(), redlease.DefaultCallBound, func(ctx context.Context, c redis.UniversalClient) (int64, error) {
		return script.Release.Run(ctx, c, line)
	})
	p.heard(ctx, key, errs[0])
	if errs[0] != nil {
		p.reloadOnSilence(errs[0])
	}
	return inspect.Forced(ctx, key, token, []string{p.addrOf(ctx, key)}, []bool{vals[0] == 1}, errs, 1)
}

// node is the primary as the one node of a survey.
func (p *Primary) node() []inspect.Node {
	return []inspect.Node{{Client: p.client, Honors: !p.bound}}
}
