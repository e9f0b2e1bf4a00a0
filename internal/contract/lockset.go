package contract

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redlease/redlease"
)

// runLockSet is the part of the suite about sets of keys (Locker.LockAll,
// TryLockAll, DoAll) taken through a Locker over the strategy.
func runLockSet(t *testing.T, setup func(t *testing.T) Setup) {
	t.Run("LockSetAllOrNone", func(t *testing.T) {
		s := setup(t)
		ctx := t.Context()
		l, err := redlease.New(s.Strategy, redlease.WithTTL(5*time.Second))
		must(t, err, "New")
		a, b := Key(t)+":a", Key(t)+":b" // a sorts first: it is taken first
		_, err = s.Strategy.Acquire(ctx, b, "tok-other", 5*time.Second)
		must(t, err, "Acquire b for another holder")

		set, err := l.TryLockAll(ctx, []string{b, a})
		isErr(t, err, redlease.ErrNotObtained, "TryLockAll with b held")
		check(t, set == nil, "a failed TryLockAll returns no set")
		check(t, err != nil && strings.Contains(err.Error(), fmt.Sprintf("%q", b)), "the error names the key it could not take: %v", err)
		// a was taken first, then released, or (a SetAcquirer) never
		// written: nothing of it is left.
		check(t, eventually(func() bool { return keyFree(t, s, a) }, 2*time.Second), "a key taken for a set that failed must be released")
		atLeast(t, holders(t, s, b, "tok-other"), s.Quorum, "the other holder keeps b")

		must(t, s.Strategy.Release(ctx, b, "tok-other"), "Release b")
		check(t, eventually(func() bool { return keyFree(t, s, b) }, 2*time.Second), "b released")
		err = l.DoAll(ctx, []string{b, a}, func(ctx context.Context, set *redlease.LockSet) error {
			check(t, set.Valid(), "the set is valid in fn")
			check(t, strings.Join(set.Keys(), ",") == a+","+b, "keys in the order taken: %v", set.Keys())
			for _, lk := range set.Locks() {
				atLeast(t, holders(t, s, lk.Key(), lk.Token()), s.Quorum, "holders of "+lk.Key())
				if s.Fencing {
					check(t, set.Fence(lk.Key()) > 0, "key %s fenced", lk.Key())
				}
			}
			return nil
		})
		must(t, err, "DoAll")
		check(t, eventually(func() bool { return keyFree(t, s, a) && keyFree(t, s, b) }, 2*time.Second), "DoAll releases every key")

		_, err = l.LockAll(ctx, []string{a, a})
		isErr(t, err, redlease.ErrInvalid, "a key given twice")
		_, err = l.LockAll(ctx, nil)
		isErr(t, err, redlease.ErrInvalid, "no keys")
	})

	t.Run("SetAcquirerAllOrNone", func(t *testing.T) {
		s := setup(t)
		sa, ok := s.Strategy.(redlease.SetAcquirer)
		if !ok {
			t.Skipf("%T takes no set in one step (not a SetAcquirer)", s.Strategy)
		}
		ctx := t.Context()
		const ttl = 5 * time.Second
		// One hash tag: one slot on a Cluster client.
		tag := "{" + Key(t) + "}"
		keys := []string{tag + ":a", tag + ":b", tag + ":c"}
		check(t, sa.Together(keys), "three keys of one hash tag are together on %T", s.Strategy)
		_, err := s.Strategy.Acquire(ctx, keys[1], "tok-other", ttl)
		must(t, err, "Acquire b for another holder")

		_, at, err := sa.AcquireSet(ctx, keys, "base.1", ttl)
		isErr(t, err, redlease.ErrNotObtained, "AcquireSet with b held")
		check(t, at == 1, "the refusal names b (index 1), not %d", at)
		check(t, keyFree(t, s, keys[0]) && keyFree(t, s, keys[2]), "a refused set writes none of its keys")

		must(t, s.Strategy.Release(ctx, keys[1], "tok-other"), "Release b")
		// An earlier attempt of the same call left a behind (its reply
		// lost): the next attempt takes it over.
		_, err = s.Strategy.Acquire(ctx, keys[0], "base.1", ttl)
		must(t, err, "Acquire a under attempt 1")
		grants, at, err := sa.AcquireSet(ctx, keys, "base.2", ttl)
		must(t, err, "AcquireSet under attempt 2")
		check(t, at == -1, "a grant names no key (%d)", at)
		check(t, len(grants) == len(keys), "%d grants for %d keys", len(grants), len(keys))
		for i, g := range grants {
			atLeast(t, holders(t, s, keys[i], "base.2"), s.Quorum, "holders of "+keys[i])
			check(t, g.Until.After(time.Now()) && g.Until.Equal(grants[0].Until), "key %d: Until %v, the set's %v", i, g.Until, grants[0].Until)
			if s.Fencing {
				check(t, g.Fence > 0, "key %d fenced", i)
			}
		}
		// The same request again (a resent one) is granted, with no
		// fence below the first.
		again, _, err := sa.AcquireSet(ctx, keys, "base.2", ttl)
		must(t, err, "AcquireSet resent")
		for i := range again {
			check(t, again[i].Fence >= grants[i].Fence, "key %d: fence %d fell below %d", i, again[i].Fence, grants[i].Fence)
		}
		for _, k := range keys {
			must(t, s.Strategy.Release(ctx, k, "base.2"), "Release %s", k)
		}
		check(t, keyFree(t, s, keys[0]) && keyFree(t, s, keys[1]) && keyFree(t, s, keys[2]), "released")
		_, _, err = sa.AcquireSet(ctx, []string{keys[0], keys[0]}, "base.3", ttl)
		isErr(t, err, redlease.ErrInvalid, "a key given twice")
		_, _, err = sa.AcquireSet(ctx, nil, "base.3", ttl)
		isErr(t, err, redlease.ErrInvalid, "no keys")
	})

	t.Run("LockSetOppositeTransfers", func(t *testing.T) {
		s := setup(t)
		l, err := redlease.New(s.Strategy, redlease.WithTTL(5*time.Second))
		must(t, err, "New")
		accounts := []string{Key(t) + ":acct1", Key(t) + ":acct2"}
		in, applied, err := Transfers(t.Context(), l, accounts, 8, 25)
		must(t, err, "transfers")
		check(t, in == 0, "%d transfers overlapped on a key", in)
		check(t, applied == 8*25, "applied %d transfers, want %d", applied, 8*25)
	})
}

// Transfers runs workers goroutines, each making n transfers between the
// two accounts with DoAll, half of them in each direction (the keys given
// in the transfer's order). It returns how many times fn found another
// transfer inside on either account (mutual exclusion broken), how many
// transfers were applied, and the first error of a transfer (each must
// succeed: no deadlock, and the set taken in full).
func Transfers(ctx context.Context, l *redlease.Locker, accounts []string, workers, n int) (overlaps, applied int64, err error) {
	if len(accounts) != 2 {
		return 0, 0, errors.New("two accounts")
	}
	var inside [2]atomic.Int32
	var balance [2]int64 // guarded by the locks themselves
	var over, done atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range n {
				from, to := (w+i)%2, (w+i+1)%2
				tctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				err := l.DoAll(tctx, []string{accounts[from], accounts[to]}, func(ctx context.Context, set *redlease.LockSet) error {
					for _, k := range []int{from, to} {
						if inside[k].Add(1) != 1 {
							over.Add(1)
						}
					}
					balance[from]--
					balance[to]++
					done.Add(1)
					for _, k := range []int{from, to} {
						inside[k].Add(-1)
					}
					return nil
				})
				cancel()
				if err != nil {
					once.Do(func() { first = fmt.Errorf("worker %d transfer %d: %w", w, i, err) })
					return
				}
			}
		})
	}
	wg.Wait()
	if first == nil && balance[0]+balance[1] != 0 {
		first = fmt.Errorf("balances %v do not sum to 0", balance)
	}
	return over.Load(), done.Load(), first
}

// keyFree reports whether no node holds key at all.
func keyFree(t *testing.T, s Setup, key string) bool {
	t.Helper()
	for _, c := range s.Nodes {
		n, err := c.Exists(context.Background(), key).Result()
		if err != nil {
			t.Errorf("reading %s: %v", key, err)
			return false
		}
		if n != 0 {
			return false
		}
	}
	return true
}
