package primary

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/bounded"
	"github.com/redlease/redlease/internal/nodes"
	"github.com/redlease/redlease/internal/script"
)

// MaxSet is the most keys AcquireSet takes in one step (Together says
// false for more): the script's command line holds two keys per lock.
const MaxSet = script.MaxBatch

// Together reports whether AcquireSet can take keys in one step: at most
// MaxSet of them and, on a Cluster client, all in one hash slot (their
// fence counters share their slots by construction). It does no I/O.
func (p *Primary) Together(keys []string) bool {
	if len(keys) == 0 || len(keys) > MaxSet {
		return false
	}
	if p.cluster == nil {
		return true
	}
	slot := keySlot(keys[0])
	for _, k := range keys[1:] {
		if keySlot(k) != slot {
			return false
		}
	}
	return true
}

// AcquireSet takes every key of keys under token for ttl in one atomic
// script (script.AcquireSet), followed by WAIT in the same pipeline when
// replicas are required: all, or none (see redlease.SetAcquirer). A grant
// that too few replicas acknowledged is undone at once and reported as an
// outage (ErrAcquireUnavailable), as Acquire's is; so is a call whose
// reply was lost, undone by token in the background. It is bounded as
// Acquire is: CallBound or ctx, whichever ends first, whatever the
// client's options.
func (p *Primary) AcquireSet(ctx context.Context, keys []string, token string, ttl time.Duration) ([]redlease.Grant, int, error) {
	if err := p.checkSet(keys, token, ttl); err != nil {
		return nil, -1, err
	}
	if err := ctx.Err(); err != nil {
		return nil, -1, redlease.Wrap(redlease.ErrNotObtained, context.Cause(ctx))
	}
	ta := p.boxedTTL(ttl)
	var fenceKeys []string
	if p.cfg.Fencing {
		fenceKeys = make([]string, len(keys))
		for i, k := range keys {
			fenceKeys[i] = script.MustFenceKey(k)
		}
	}
	line := script.AcquireSetArgs(keys, fenceKeys, token, ttl.Milliseconds(), ta.fenceTTL)
	start := p.cfg.Clock.Now()
	bctx, cancel := p.deadlines.Bound(ctx)
	v, err := bounded.Call(bctx, p.bound, func(ctx context.Context) ([]int64, error) {
		return p.runInts(ctx, script.AcquireSet, keys[0], line)
	}, func(v []int64, err error) {
		// Abandoned: reported as not obtained; undone unless it surely
		// wrote nothing.
		if !setWroteNothing(v, err) {
			p.undoSet(nil, keys, token)
		}
	})
	cancel()
	p.heard(ctx, keys[0], err)
	granted := len(v) == len(keys)+1 && v[0] == 1
	var ab bounded.Abandoned
	switch {
	case errors.Is(err, ErrNotReplicated) && granted:
		p.undoSet(ctx, keys, token)
		sentinel := ErrAcquireUnavailable
		if nodes.Denied(err) {
			sentinel = redlease.ErrDenied
		}
		return nil, -1, redlease.Wrap(sentinel, err)
	case err != nil:
		if !notSent(err) && !errors.As(err, &ab) { // an abandoned call undoes itself when it returns
			p.undoSet(nil, keys, token)
		}
		return nil, -1, p.fail(ctx, keys[0], ErrAcquireUnavailable, err)
	case len(v) == 3 && v[0] == 0 && v[1] >= 1 && int(v[1]) <= len(keys) && script.IsTaken(v[2]):
		at := int(v[1]) - 1
		if d, ok := script.Remaining(v[2]); ok {
			return nil, at, &redlease.HeldError{Remaining: d}
		}
		return nil, at, redlease.ErrNotObtained
	case !granted:
		p.undoSet(nil, keys, token)
		return nil, -1, p.fail(ctx, keys[0], ErrAcquireUnavailable, fmt.Errorf("acquire set: unexpected reply %v", v))
	}
	until := start.Add(ttl - p.DriftAllowance(ttl))
	if !p.cfg.Clock.Now().Before(until) {
		p.undoSet(ctx, keys, token)
		return nil, -1, fmt.Errorf("%w: no validity left after %v", redlease.ErrNotObtained, p.cfg.Clock.Now().Sub(start))
	}
	grants := make([]redlease.Grant, len(keys))
	for i := range grants {
		grants[i] = redlease.Grant{Until: until, Fence: uint64(v[i+1])}
	}
	return grants, -1, nil
}

// checkSet rejects what AcquireSet would reject before sending anything:
// what Acquire rejects for any key, no key, a key twice, or keys that are
// not Together.
func (p *Primary) checkSet(keys []string, token string, ttl time.Duration) error {
	if len(keys) == 0 {
		return redlease.Invalid("no keys")
	}
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if err := p.check(k, token, ttl); err != nil {
			return err
		}
		if seen[k] {
			return redlease.Invalid("key %q given twice", k)
		}
		seen[k] = true
	}
	if !p.Together(keys) {
		return redlease.Invalid("%d keys: not in one hash slot, or more than %d: they cannot be taken in one step", len(keys), MaxSet)
	}
	if p.cfg.FenceTTL > 0 && ttl > p.cfg.FenceTTL {
		return redlease.Invalid("ttl %v: longer than the fence counter TTL %v (WithFenceTTL), which must be at least every TTL acquired with", ttl, p.cfg.FenceTTL)
	}
	return nil
}

// setWroteNothing is wroteNothing for AcquireSet: a refusal, or an error
// that says the call was never sent.
func setWroteNothing(v []int64, err error) bool {
	if err != nil {
		return notSent(err)
	}
	return len(v) > 0 && v[0] == 0
}

// undoSet deletes, by token, what a failed AcquireSet may have written,
// each key as undoLater does, all at once in the background; with wait
// not nil it returns when every key's clean-up ended or wait is done.
func (p *Primary) undoSet(wait context.Context, keys []string, token string) {
	if wait == nil {
		for _, k := range keys {
			p.undoLater(nil, k, token)
		}
		return
	}
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Go(func() { p.undoLater(wait, k, token) })
	}
	wg.Wait()
}
