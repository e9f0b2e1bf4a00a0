package main

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/redlease/redlease/internal/redistest"
)

// stallMultiple is the multiple of this process's measured stall that a
// timing assertion here allows on top of its bound
// (redistest.StallProbe.Allowance). The CLI runs as another process on
// the same machine: this process's stall stands for the machine's.
const stallMultiple = 2

// assertWithin checks that what began at start ended by now within bound,
// plus stallMultiple times what p measured this process stalled meanwhile;
// the failure message says how the window was derived.
func assertWithin(t *testing.T, p *redistest.StallProbe, bound time.Duration, start time.Time, what string, args ...any) {
	t.Helper()
	end := time.Now()
	took := end.Sub(start)
	assert.LessOrEqual(t, took, p.Allowance(bound, stallMultiple, start, end), "%s: took %v; %s",
		fmt.Sprintf(what, args...), took, p.Explain(bound, stallMultiple, start, end))
}

// syncBuffer is a bytes.Buffer safe for a child process's output copier
// and a test reading it at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
