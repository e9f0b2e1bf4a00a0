package contract

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redlease/redlease"
)

// runSemaphore is the part of the suite about semaphores
// (Locker.Semaphore): permits are locks of slot keys, so the bound of N
// holds on every strategy.
func runSemaphore(t *testing.T, setup func(t *testing.T) Setup) {
	t.Run("SemaphoreNeverMoreThanN", func(t *testing.T) {
		s := setup(t)
		ctx := t.Context()
		l, err := redlease.New(s.Strategy, redlease.WithTTL(5*time.Second), redlease.WithRetryDelay(time.Millisecond, 20*time.Millisecond))
		must(t, err, "New")
		const n = 3
		sem, err := l.Semaphore(Key(t), n)
		must(t, err, "Semaphore")

		// Every slot taken by TryAcquire, each one its own slot, held on a
		// quorum of nodes, fenced.
		var permits []*redlease.Lock
		seen := map[string]bool{}
		for i := range n {
			lk, err := sem.TryAcquire(ctx)
			must(t, err, "TryAcquire %d of %d", i+1, n)
			check(t, !seen[lk.Key()], "permit %d on slot %s, already given", i, lk.Key())
			seen[lk.Key()] = true
			atLeast(t, holders(t, s, lk.Key(), lk.Token()), s.Quorum, "holders of "+lk.Key())
			if s.Fencing {
				check(t, lk.Fence() > 0, "permit on %s not fenced", lk.Key())
			}
			permits = append(permits, lk)
		}
		for _, slot := range sem.Slots() {
			check(t, seen[slot], "slot %s never given", slot)
		}
		_, err = sem.TryAcquire(ctx)
		isErr(t, err, redlease.ErrNotObtained, "TryAcquire with every slot held")
		check(t, !errors.Is(err, redlease.ErrUnavailable), "every slot refused is not an outage: %v", err)
		var pe *redlease.PermitError
		check(t, errors.As(err, &pe) && len(pe.Slots) == n, "a *PermitError with each slot's error: %v", err)
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err = sem.Acquire(wctx)
		cancel()
		isErr(t, err, redlease.ErrNotObtained, "Acquire with every slot held until its deadline")
		isErr(t, err, context.DeadlineExceeded, "Acquire with every slot held until its deadline")

		// One released: the next permit is that slot, with a higher fence.
		must(t, permits[1].Release(ctx), "Release")
		check(t, eventually(func() bool { return keyFree(t, s, permits[1].Key()) }, 2*time.Second), "released slot free")
		lk, err := sem.Acquire(ctx)
		must(t, err, "Acquire after a release")
		check(t, lk.Key() == permits[1].Key(), "the permit is the released slot's: %s, want %s", lk.Key(), permits[1].Key())
		if s.Fencing {
			check(t, lk.Fence() > permits[1].Fence(), "slot %s: fence %d after %d", lk.Key(), lk.Fence(), permits[1].Fence())
		}
		for _, p := range append(permits, lk) {
			_ = p.Release(ctx)
		}

		// Contenders under Do: never more than n inside.
		max, runs, err := Contend(ctx, sem, 8, 10)
		must(t, err, "contenders")
		check(t, max <= n, "%d holders inside at once, at most %d allowed", max, n)
		check(t, runs == 80, "%d runs, want 80", runs)
	})
}

// Contend runs workers goroutines, each making runs calls of sem.Do (each
// with 30 s) whose fn counts the holders inside. It returns the most
// found inside at once, the runs made, and the first error of a Do.
func Contend(ctx context.Context, sem *redlease.Semaphore, workers, runs int) (maxInside, made int64, err error) {
	var inside, most, done atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range runs {
				dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := sem.Do(dctx, func(ctx context.Context, _ *redlease.Lock) error {
					in := inside.Add(1)
					for {
						m := most.Load()
						if in <= m || most.CompareAndSwap(m, in) {
							break
						}
					}
					time.Sleep(time.Millisecond)
					done.Add(1)
					inside.Add(-1)
					return nil
				})
				cancel()
				if err != nil {
					once.Do(func() { first = fmt.Errorf("worker %d run %d: %w", w, i, err) })
					return
				}
			}
		})
	}
	wg.Wait()
	return most.Load(), done.Load(), first
}
