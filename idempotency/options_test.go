package idempotency_test

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/quorum"
	"github.com/redlease/redlease/single"
)

// A lock strategy built without fencing grants fence 0, and the claim's
// guard against a late claim (a record in progress under a higher fence
// is never taken over) compares fences: without them a late claim takes
// the running owner's record over. New refuses such a strategy, of each
// kind, and still takes the same kinds with fencing on.
func TestUnfencedStrategyIsRefused(t *testing.T) {
	c := store(t)
	q := func(opts ...quorum.Option) redlease.Strategy {
		s, err := quorum.New([]redis.UniversalClient{c}, opts...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	f := func(opts ...failover.Option) redlease.Strategy {
		s, err := failover.New(c, opts...)
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	unfenced := map[string]redlease.Strategy{
		"single":   singleOn(t, c, single.WithoutFencing()),
		"quorum":   q(quorum.WithoutFencing()),
		"failover": f(failover.WithoutFencing()),
	}
	for name, s := range unfenced {
		b, err := idempotency.New(c, idempotency.WithStrategy(s))
		assert.ErrorIs(t, err, redlease.ErrInvalid, "%s without fencing", name)
		assert.Nil(t, b, "%s without fencing", name)
	}
	fenced := map[string]redlease.Strategy{
		"single":   singleOn(t, c),
		"quorum":   q(),
		"failover": f(),
	}
	for name, s := range fenced {
		_, err := idempotency.New(c, idempotency.WithStrategy(s))
		assert.NoError(t, err, "%s with fencing", name)
	}
}
