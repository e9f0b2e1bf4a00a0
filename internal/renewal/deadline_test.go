package renewal_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/redlease/redlease/internal/renewal"
)

// sickExtender takes took per call (or until its ctx ends) and never
// extends sick: its renewals fail with a transient error, so it is
// retried while its deadline comes closer. It counts the renewals of the
// other items that failed because the call's ctx ended.
type sickExtender struct {
	took time.Duration
	sick *item

	mu           sync.Mutex
	healthyCut   int
	healthyCalls int
}

var errTransient = errors.New("transient")

func (x *sickExtender) extend(ctx context.Context, items []*item) []error {
	errs := make([]error, len(items))
	select {
	case <-time.After(x.took):
	case <-ctx.Done():
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	for i, it := range items {
		switch {
		case it == x.sick:
			errs[i] = errTransient
		case ctx.Err() != nil:
			x.healthyCut++
			errs[i] = ctx.Err()
		default:
			x.healthyCalls++
			it.mu.Lock()
			it.until = time.Now().Add(it.ttl)
			it.mu.Unlock()
		}
	}
	return errs
}

// A lock near its deadline (its renewals keep failing) does not cut short
// the renewal call of the healthy locks batched with it: the call's
// deadline is its latest item's (within the renewal timeout), not its
// earliest's — a reply after a lock's own deadline is ignored for that
// lock anyway.
func TestANearlyLostLockDoesNotShortenItsBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		x := &sickExtender{took: 150 * time.Millisecond}
		w := renewal.New(renewal.Config[*item]{
			Timeout: time.Second,
			Extend:  x.extend,
			NotHeld: func(err error) bool { return errors.Is(err, errNotHeld) },
			Lane:    func(*item) any { return "one" },
		})
		defer w.Close()
		x.sick = newItem(time.Second)
		var stops []func()
		stops = append(stops, w.Keep(x.sick))
		healthy := make([]*item, 20)
		for i := range healthy {
			healthy[i] = newItem(time.Second)
			stops = append(stops, w.Keep(healthy[i]))
			time.Sleep(37 * time.Millisecond) // due at scattered moments
		}
		time.Sleep(5 * time.Second)
		for _, it := range healthy {
			assert.True(t, it.Valid(), "a healthy item was lost")
		}
		x.mu.Lock()
		defer x.mu.Unlock()
		t.Logf("healthy renewals %d, cut short by the call's deadline %d", x.healthyCalls, x.healthyCut)
		assert.Zero(t, x.healthyCut, "healthy renewals cut short by a nearly lost item's deadline")
		for _, stop := range stops {
			stop()
		}
	})
}
