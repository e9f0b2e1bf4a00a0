package redlease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
)

// hangingExtends is the fake strategy whose Extend never gets an answer:
// it returns when its ctx ends, undecided (ErrUnavailable), as a strategy
// bounding a call by its ctx does.
type hangingExtends struct{ *fake }

func (h hangingExtends) Extend(ctx context.Context, key, token string, ttl time.Duration) (redlease.Grant, error) {
	<-ctx.Done()
	return redlease.Grant{}, fmt.Errorf("%w: extend: %w", redlease.ErrUnavailable, ctx.Err())
}

// A kept lock whose renewal hangs is lost at its deadline, the instant the
// renewal's ctx (the lock's deadline) ends too: the lock's expiry timer and
// the renewal's return run at one instant, in the Go scheduler's order. The
// loss is decided one way whatever that order: an extension that failed
// only at the deadline or later is not named as the last one that failed,
// so Do's error is ErrLost and not ErrUnavailable. (Before, the renewal
// returning first made it name that failure, and Do's error matched
// ErrUnavailable: the simulator's ops-failover seed 18 replayed four ways.)
func TestLossAtADeadlineARenewalEndsAtIsDecidedOneWay(t *testing.T) {
	const runs = 40
	named := 0
	for range runs {
		synctest.Test(t, func(t *testing.T) {
			l, err := redlease.New(hangingExtends{newFake()}, redlease.WithTTL(100*time.Millisecond))
			require.NoError(t, err)
			var cause error
			err = l.Do(t.Context(), "job", func(ctx context.Context, lk *redlease.Lock) error {
				<-ctx.Done()
				cause = context.Cause(ctx)
				return nil
			})
			require.ErrorIs(t, err, redlease.ErrLost)
			require.ErrorIs(t, cause, redlease.ErrLost)
			if errors.Is(err, redlease.ErrUnavailable) {
				named++
			}
		})
	}
	assert.Zero(t, named, "of %d losses, %d named a renewal that failed at the deadline", runs, named)
}
