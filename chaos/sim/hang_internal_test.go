package sim

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The hang guard names the seed in flight longest once it passes the
// limit, and nothing before; the limit follows the run's measured pace.
func TestHungSeedIsNamedWithItsReplay(t *testing.T) {
	f := newInFlight()
	t0 := time.Unix(1000, 0)
	name := func(s uint64) string { return map[uint64]string{7: "ops-quorum", 9: "single"}[s] }
	_, ok := f.hung(t0, time.Minute, name)
	assert.False(t, ok, "nothing in flight")
	f.start(9, t0.Add(time.Second))
	f.start(7, t0)
	_, ok = f.hung(t0.Add(time.Minute), time.Minute, name)
	assert.False(t, ok, "at the limit is not past it")
	line, ok := f.hung(t0.Add(61*time.Second), time.Minute, name)
	require.True(t, ok)
	assert.Contains(t, line, "seed 7 (ops-quorum) hung")
	assert.Contains(t, line, "-scenario ops-quorum -seed 7")
	f.end(7)
	_, ok = f.hung(t0.Add(61*time.Second), time.Minute, name)
	assert.False(t, ok, "seed 9 began a second later")

	assert.Equal(t, minHang, hangLimit(0, time.Hour, 2), "before any seed ended")
	assert.Equal(t, minHang, hangLimit(1000, 10*time.Second, 2), "1,000 x 20 ms is under the floor")
	assert.Equal(t, 200*time.Second, hangLimit(1000, 100*time.Second, 2), "1,000 x 200 ms per seed per worker")

	var out bytes.Buffer
	exited := make(chan struct{})
	f.end(9)
	f.start(7, time.Now().Add(-time.Hour))
	go f.watch(make(chan struct{}), func() time.Duration { return time.Minute }, name, &out, func() { close(exited) })
	select {
	case <-exited:
	case <-time.After(time.Minute):
		t.Fatal("watch did not report a seed in flight for an hour")
	}
	assert.True(t, strings.HasPrefix(out.String(), "--- FAIL: TestSim: seed 7 (ops-quorum) hung"), out.String()[:min(200, out.Len())])
	assert.Contains(t, out.String(), "goroutine ", "every goroutine's stack")
}
