package contract

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redlease/redlease"
)

// runElection is the part of the suite about leader election
// (redlease.Election) over the strategy: a strategy that is an Elector with
// fences elects one leader at a time, in rising terms, and refuses a
// deposed leader's Proclaim; any other is refused with ErrInvalid.
func runElection(t *testing.T, setup func(t *testing.T) Setup) {
	t.Run("ElectionOneLeaderTermsRise", func(t *testing.T) {
		s := setup(t)
		l, err := redlease.New(s.Strategy, redlease.WithTTL(5*time.Second), redlease.WithRetryDelay(time.Millisecond, 20*time.Millisecond))
		must(t, err, "New")
		e, err := redlease.NewElection(l, Key(t))
		if _, ok := s.Strategy.(redlease.Elector); !ok || !s.Fencing {
			isErr(t, err, redlease.ErrInvalid, "NewElection on a strategy that cannot hold one")
			return
		}
		must(t, err, "NewElection")

		obsCtx, stopObs := context.WithCancel(t.Context())
		var seen []redlease.Leader
		obsDone := make(chan struct{})
		go func() {
			defer close(obsDone)
			for ld := range e.Observe(obsCtx) {
				seen = append(seen, ld)
			}
		}()

		const campaigners, rounds = 4, 5
		ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
		defer cancel()
		var (
			inside, overlaps, notRising, wrong atomic.Int32
			lastTerm                           atomic.Uint64
			mu                                 sync.Mutex
			proclaimed                         = map[redlease.Leader]bool{}
			first                              error
			wg                                 sync.WaitGroup
		)
		fail := func(err error) {
			mu.Lock()
			defer mu.Unlock()
			if first == nil {
				first = err
			}
		}
		for w := range campaigners {
			wg.Go(func() {
				for r := range rounds {
					v := fmt.Sprintf("w%d-r%d", w, r)
					ld, err := e.Campaign(ctx, v)
					if err != nil {
						fail(fmt.Errorf("campaign %s: %w", v, err))
						return
					}
					if inside.Add(1) != 1 {
						overlaps.Add(1)
					}
					term := ld.Term()
					if prev := lastTerm.Swap(term); term <= prev {
						notRising.Add(1)
					}
					mu.Lock()
					proclaimed[redlease.Leader{Term: term, Value: v}] = true
					proclaimed[redlease.Leader{Term: term, Value: v + "'"}] = true
					mu.Unlock()
					if got, err := e.Leader(ctx); err != nil || got != (redlease.Leader{Term: term, Value: v}) {
						wrong.Add(1)
					}
					if err := ld.Proclaim(ctx, v+"'"); err != nil {
						fail(fmt.Errorf("proclaim %s: %w", v, err))
					}
					if got, err := e.Leader(ctx); err != nil || got != (redlease.Leader{Term: term, Value: v + "'"}) {
						wrong.Add(1)
					}
					inside.Add(-1)
					if err := ld.Resign(ctx); err != nil {
						fail(fmt.Errorf("resign %s: %w", v, err))
					}
				}
			})
		}
		wg.Wait()
		stopObs()
		<-obsDone
		must(t, first, "every campaign, proclaim and resign")
		check(t, overlaps.Load() == 0, "%d leaders found another leader in office", overlaps.Load())
		check(t, notRising.Load() == 0, "%d terms did not rise above the one before", notRising.Load())
		check(t, wrong.Load() == 0, "%d reads of the leader did not give the leader's own term and value", wrong.Load())
		check(t, len(seen) > 0, "the observer saw no leader")
		for i, ld := range seen {
			check(t, proclaimed[ld], "observed %v, which no leader proclaimed", ld)
			if i > 0 {
				check(t, ld.Term >= seen[i-1].Term, "observed terms fell: %v after %v", ld, seen[i-1])
			}
		}
	})

	t.Run("ElectionDeposedProclaimRefused", func(t *testing.T) {
		s := setup(t)
		l, err := redlease.New(s.Strategy, redlease.WithTTL(5*time.Second))
		must(t, err, "New")
		key := Key(t)
		e, err := redlease.NewElection(l, key)
		if err != nil {
			isErr(t, err, redlease.ErrInvalid, "NewElection")
			return
		}
		ctx := t.Context()
		ld, err := e.Campaign(ctx, "old")
		must(t, err, "Campaign")
		// Deposed behind its back: another token holds the key on every node.
		for _, n := range s.Nodes {
			must(t, n.Set(ctx, key, "tok-other", 5*time.Second).Err(), "SET on a node")
		}
		isErr(t, ld.Proclaim(ctx, "late"), redlease.ErrNotHeld, "a deposed leader's Proclaim")
		_, err = e.Leader(ctx)
		isErr(t, err, redlease.ErrNoLeader, "Leader while the key's holder recorded nothing")
		select {
		case <-ld.Lost():
		default:
			t.Error("a Proclaim the nodes refused must mark the leadership lost")
		}
		isErr(t, ld.Proclaim(ctx, "later"), redlease.ErrLost, "Proclaim after the loss")
		_ = ld.Resign(ctx)
	})
}
