package chaos

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
)

func TestRegisterSemantics(t *testing.T) {
	ctx := context.Background()
	rec := NewRecorder("register semantics")
	reg := rec.Register(redistest.Start(t, redistest.Config{}).Client(), "register:semantics")

	steps := []struct {
		fence uint64
		want  bool
	}{
		{0, false}, // a fresh register is at fence 0: fencing off never writes
		{5, true},
		{5, false}, // strictly greater, not equal
		{4, false},
		{6, true},
		// Beyond 2^53, where a Lua number could no longer tell them apart.
		{1<<53 + 1, true},
		{1 << 53, false},
		{math.MaxUint64, true},
		{math.MaxUint64 - 1, false},
	}
	for i, s := range steps {
		ok, err := reg.Write(ctx, "a", s.fence, int64(i))
		require.NoError(t, err)
		assert.Equal(t, s.want, ok, "fence %d", s.fence)
	}
	fence, value, err := reg.Read(ctx, "a")
	require.NoError(t, err)
	assert.Equal(t, uint64(math.MaxUint64), fence)
	assert.Equal(t, int64(7), value)

	res := rec.Check("none", "none", Expectation{})
	assert.True(t, res.Linearizable, res.Notes)
	assert.Equal(t, 5, res.StaleRejected)
}

// TestRegisterConcurrentWritersAreLinearizable runs writers with random
// fences against a real server: the history porcupine sees is genuinely
// concurrent, and must be linearizable.
func TestRegisterConcurrentWritersAreLinearizable(t *testing.T) {
	ctx := context.Background()
	rec := NewRecorder("concurrent register")
	reg := rec.Register(redistest.Start(t, redistest.Config{}).Client(), "register:concurrent")

	const writers, opsEach = 8, 30
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		rejected int
		maxFence uint64
	)
	for w := range writers {
		holder := string(rune('a' + w))
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range opsEach {
				if i%5 == 4 {
					_, _, err := reg.Read(ctx, holder)
					assert.NoError(t, err)
					continue
				}
				fence := rng.Uint64N(200) + 1
				ok, err := reg.Write(ctx, holder, fence, int64(w*1000+i))
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				if !ok {
					rejected++
				}
				maxFence = max(maxFence, fence)
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	fence, _, err := reg.Read(ctx, "check")
	require.NoError(t, err)
	assert.Equal(t, maxFence, fence)

	res := rec.Check("none", "none", Expectation{})
	assert.True(t, res.Linearizable, res.Notes)
	assert.Equal(t, LinOK, res.Linearizability)
	assert.Equal(t, rejected, res.StaleRejected)
	assert.Positive(t, res.StaleRejected, "random fences should collide")
}

// TestRegisterTimedOutWriteMayApplyLater times a write out against a
// paused server; the server may apply it when it resumes, after the client
// gave up. The checker must accept the history whichever happened.
func TestRegisterTimedOutWriteMayApplyLater(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t, redistest.Config{})
	rec := NewRecorder("timed-out write")
	reg := rec.Register(srv.Client(), "register:timeout")

	ok, err := reg.Write(ctx, "a", 1, 1)
	require.NoError(t, err)
	require.True(t, ok)

	srv.Pause()
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = reg.Write(tctx, "b", 2, 2)
	cancel()
	srv.Resume()
	require.Error(t, err)

	_, _, err = reg.Read(ctx, "c")
	require.NoError(t, err)

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = reg.Write(cctx, "d", 3, 3) // never sent: also unknown to the recorder
	require.ErrorIs(t, err, context.Canceled)

	res := rec.Check("none", "none", Expectation{})
	assert.True(t, res.Linearizable, res.Notes)
	assert.Equal(t, VerdictPass, res.Verdict)
	assert.Contains(t, res.Notes, "2 register writes failed and may or may not have taken effect")
}

// TestTamperedHistoryIsNotLinearizable takes a real history and changes
// what one read saw: the checker must notice, fail the scenario and draw
// porcupine's visualisation.
func TestTamperedHistoryIsNotLinearizable(t *testing.T) {
	ctx := context.Background()
	rec := NewRecorder("tampered")
	reg := rec.Register(redistest.Start(t, redistest.Config{}).Client(), "register:tampered")
	for f := uint64(1); f <= 3; f++ {
		_, err := reg.Write(ctx, "a", f, int64(f*10))
		require.NoError(t, err)
	}
	fence, value, err := reg.Read(ctx, "b")
	require.NoError(t, err)
	require.Equal(t, uint64(3), fence)
	require.Equal(t, int64(30), value)

	assert.True(t, rec.Check("none", "none", Expectation{}).Linearizable)

	rec.mu.Lock()
	last := &rec.ops[len(rec.ops)-1]
	require.False(t, last.in.Write)
	last.out = registerOutput{Fence: 1, Value: 10} // a read that saw the past
	rec.mu.Unlock()

	res := rec.Check("none", "none", Expectation{AllowOverlap: true, AllowStrays: true, AllowLedgerLoss: true, AllowLostLate: true})
	assert.False(t, res.Linearizable)
	assert.Equal(t, LinIllegal, res.Linearizability)
	assert.Equal(t, VerdictFail, res.Verdict)
	assert.True(t, res.Failed())

	dir := t.TempDir()
	require.NoError(t, rec.WriteReport(dir, res))
	html, err := os.ReadFile(filepath.Join(dir, res.Slug()+"-porcupine.html"))
	require.NoError(t, err)
	assert.Contains(t, string(html), "<html")
}

// TestBrokenModelIsCaught checks that the checker is sensitive to the
// model: a register that accepted equal fences would not explain a real
// history with a refused equal-fence write.
func TestBrokenModelIsCaught(t *testing.T) {
	ctx := context.Background()
	rec := NewRecorder("broken model")
	reg := rec.Register(redistest.Start(t, redistest.Config{}).Client(), "register:model")
	for _, f := range []uint64{1, 2, 2, 3} {
		_, err := reg.Write(ctx, "a", f, int64(f))
		require.NoError(t, err)
	}
	ops := rec.snapshot().ops

	good, _ := checkWith(registerModel(), ops, 5*time.Second)
	assert.Equal(t, porcupine.Ok, good)

	broken := registerModel()
	broken.Step = func(state, input, output any) (bool, any) {
		in := input.(registerInput)
		if in.Write && in.Fence == state.(registerState).Fence {
			in.Fence++ // pretend equal fences are accepted
		}
		return stepRegister(state, in, output)
	}
	bad, _ := checkWith(broken, ops, 5*time.Second)
	assert.Equal(t, porcupine.Illegal, bad)
}
