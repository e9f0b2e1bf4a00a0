package idempotency_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/redlease/redlease/internal/redistest"
)

// stallMultiple is the multiple of this process's measured stall that a
// timing assertion here allows on top of its bound
// (redistest.StallProbe.Allowance).
const stallMultiple = 2

// assertWithin checks that what began at start and took took stayed
// within bound, plus stallMultiple times what p measured this process
// stalled meanwhile; the failure message says how the window was derived.
func assertWithin(t *testing.T, p *redistest.StallProbe, bound time.Duration, start time.Time, took time.Duration, what string, args ...any) {
	t.Helper()
	end := start.Add(took)
	assert.Less(t, took, p.Allowance(bound, stallMultiple, start, end), "%s: took %v; %s",
		fmt.Sprintf(what, args...), took, p.Explain(bound, stallMultiple, start, end))
}
