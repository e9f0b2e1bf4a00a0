package redlease

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/redlease/redlease/internal/renewal"
)

// Keeper keeps locks alive by extending them before they expire. The renew
// package's Watchdog is one, shared by a whole process. Locker.Do uses the
// Keeper given with WithKeeper, or else the process-wide default watchdog.
type Keeper interface {
	// Keep extends lk from now on until stop is called, lk is released, or
	// lk is lost. Calling stop more than once is harmless.
	Keep(lk *Lock) (stop func())
}

// The renewal engine waits for a lane's calls at least twice its strategy's
// CallBound, through an interface of its own with the same method.
var _ renewal.CallBounder = CallBounder(nil)

// defaultKeeper is the one process-wide default watchdog that Do uses
// without WithKeeper: renew.Watchdog's engine with its default options,
// made on first use, whose goroutines run only while it keeps a lock or a
// renewal call is in flight.
var defaultKeeper = sync.OnceValue(func() *renewal.Engine[*Lock] {
	return renewal.New(renewal.Config[*Lock]{
		Extend:   ExtendAll,
		NotHeld:  func(err error) bool { return errors.Is(err, ErrNotHeld) },
		Lane:     func(lk *Lock) any { return renewal.LaneKey(lk.strategy, lk) },
		IdleStop: true,
	})
})

// ExtendAll extends every lock by its own TTL (Lock.TTL, the TTL of its
// latest Lock.Extend) and records each outcome on its lock exactly as
// Lock.Extend does, through the same bookkeeping: a new Until, or the lock
// marked lost when it is not held; Until never moves back, nor past
// the start plus the shorter TTL of another extension a node may apply
// after the renewal (see Lock.Extend); a renewal whose answer never came
// caps later extensions as an Extend's does. Locks already released or
// lost get ErrNotHeld without a round trip. The result matches locks one
// to one.
//
// Locks are grouped by strategy; a strategy that is a BatchExtender gets
// one call for its whole group, any other gets one Extend per lock. Groups
// run at the same time, each on its own goroutine (one group runs on the
// caller's), and each under its own deadline: ctx's, narrowed to the
// latest Deadline (Until less the loss margin) among its locks, past which
// an answer comes too late for every one of them (a lock whose own
// deadline passes first is lost then, and a late answer does not revive
// it; a lock near its deadline does not cut the call short for the
// others). A slow or hung strategy therefore never delays another's group.
//
// ExtendAll returns once every group's call has returned. A strategy whose
// client ignores the context (go-redis without ContextTimeoutEnabled waits
// for its ReadTimeout and retries) can hold it past the deadline; the renew
// package's Watchdog stops waiting at the deadline instead.
func ExtendAll(ctx context.Context, locks []*Lock) []error {
	errs := make([]error, len(locks))
	recs := make([]*pendingExtend, len(locks))
	groups := groupByStrategy(locks, recs, errs)
	switch len(groups) {
	case 0:
		return errs
	case 1:
		extendGroup(ctx, locks, recs, groups[0], errs)
		return errs
	}
	var wg sync.WaitGroup
	for _, g := range groups[1:] {
		wg.Go(func() { extendGroup(ctx, locks, recs, g, errs) })
	}
	extendGroup(ctx, locks, recs, groups[0], errs)
	wg.Wait()
	return errs
}

// strategyGroup is the locks (indexes into ExtendAll's slice) of one strategy.
type strategyGroup struct {
	s   Strategy
	idx []int
}

// groupByStrategy begins the renewal of every usable lock (recs[i]) and
// groups those locks by strategy; for the others it records ErrNotHeld
// (with its cause) in errs.
func groupByStrategy(locks []*Lock, recs []*pendingExtend, errs []error) []strategyGroup {
	var groups []strategyGroup
	for i, lk := range locks {
		if lk == nil {
			errs[i] = ErrNotHeld
			continue
		}
		rec, err := lk.beginRenewal()
		if err != nil {
			errs[i] = err
			continue
		}
		recs[i] = rec
		g := -1
		if comparableStrategy(lk.strategy) { // == on an incomparable dynamic value panics
			for j := range groups {
				if groups[j].s == lk.strategy {
					g = j
					break
				}
			}
		}
		if g < 0 {
			groups = append(groups, strategyGroup{s: lk.strategy})
			g = len(groups) - 1
		}
		groups[g].idx = append(groups[g].idx, i)
	}
	return groups
}

// comparableStrategy reports whether s can be compared with == (and used as
// a map key) without a panic: every strategy in this module is a pointer,
// but a struct holding a slice, or an interface holding one, is not.
func comparableStrategy(s Strategy) bool {
	if s == nil {
		return true
	}
	t := reflect.TypeOf(s)
	return t.Kind() == reflect.Pointer || reflect.ValueOf(s).Comparable()
}

// extendGroup sends one strategy's renewals (begun as recs) under the
// group's own deadline (the latest of its locks') and records the outcomes
// on the locks and in errs.
func extendGroup(ctx context.Context, locks []*Lock, recs []*pendingExtend, grp strategyGroup, errs []error) {
	deadline := locks[grp.idx[0]].Deadline()
	for _, i := range grp.idx[1:] {
		if d := locks[i].Deadline(); d.After(deadline) {
			deadline = d
		}
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	s, idx := grp.s, grp.idx
	b, ok := s.(BatchExtender)
	if !ok {
		for _, i := range idx {
			lk := locks[i]
			sent := time.Now()
			g, err := s.Extend(ctx, lk.fullKey, lk.token, recs[i].ttl)
			errs[i] = lk.finishExtend(recs[i], g, err)
			lk.observeRenewal(sent, errs[i])
		}
		return
	}
	items := make([]Extension, len(idx))
	for j, i := range idx {
		items[j] = Extension{Key: locks[i].fullKey, Token: locks[i].token, TTL: recs[i].ttl}
	}
	sent := time.Now()
	out := b.ExtendBatch(ctx, items)
	for j, i := range idx {
		var ext Extended
		if j < len(out) {
			ext = out[j]
		} else {
			// Undecided: the strategy may have sent it.
			ext.Err = fmt.Errorf("%w: strategy returned %d results for %d extensions", ErrUnavailable, len(out), len(items))
		}
		errs[i] = locks[i].finishExtend(recs[i], ext.Grant, ext.Err)
		locks[i].observeRenewal(sent, errs[i])
	}
}
