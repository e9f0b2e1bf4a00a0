package chaos

import (
	"slices"
	"sync"
	"time"
)

// NeverLost is Hold.LostAt for a hold whose Lost channel never closed.
const NeverLost time.Duration = -1

// Recorder collects, on one monotonic clock, every hold, every register
// operation and every fault of one scenario. It is safe for concurrent use:
// holders record from their own goroutines while faults are injected.
type Recorder struct {
	scenario string
	// start carries a monotonic reading, so durations measured from it are
	// immune to wall-clock steps (which is what some scenarios inject).
	start time.Time

	mu     sync.Mutex
	holds  []Hold
	faults []Fault
	ops    []registerOp
	// failures are the failed lock attempts: expected under faults, kept
	// so that a scenario which granted nothing, or failed for a reason
	// nobody meant (a wrong address), shows it.
	failures []failure
}

// failure is one lock attempt that did not obtain the lock.
type failure struct{ holder, err string }

// Hold is one holder's belief interval: from the grant to the earliest of
// Until, loss and release. Overlap (O2) is judged on [From, To), between
// holds of one Key.
type Hold struct {
	Holder string
	// Key is the lock's key in a scenario that holds several: holds of
	// different keys never overlap. Empty for a scenario of one key.
	Key    string
	Fence  uint64
	From   time.Duration // when the grant returned
	To     time.Duration // min(Until, LostAt if lost, ReleasedAt if released)
	Until  time.Duration // the grant's Until (as last extended)
	LostAt time.Duration // when Lost() closed; NeverLost (-1) if it never did
}

// Fault marks an injected fault on the timeline: a span, or an instant when
// From == To.
type Fault struct {
	Name     string
	From, To time.Duration
}

// NewRecorder starts a recorder for one scenario; its clock reads 0 now.
func NewRecorder(scenario string) *Recorder {
	return &Recorder{scenario: scenario, start: time.Now()}
}

// Scenario returns the name the recorder was created with.
func (r *Recorder) Scenario() string { return r.scenario }

// Now returns the time since NewRecorder on the monotonic clock.
func (r *Recorder) Now() time.Duration { return time.Since(r.start) }

// At converts a time.Time taken in this process (for example Lock.Until())
// to the recorder's clock. It is exact when t carries a monotonic reading,
// as every time derived from time.Now() does; a time without one (parsed,
// or the zero Time) is compared by wall clock and may be far off.
func (r *Recorder) At(t time.Time) time.Duration { return t.Sub(r.start) }

// AddHold records one hold. Call it once the hold is over (released, lost
// or expired), when To is known.
func (r *Recorder) AddHold(h Hold) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holds = append(r.holds, h)
}

// AddFault records one injected fault.
func (r *Recorder) AddFault(f Fault) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults = append(r.faults, f)
}

// Failure records a lock attempt by holder that failed with err. It is
// counted in Result.Failures and is not an error of the test: under faults,
// refusing a grant is the strategy doing its job.
func (r *Recorder) Failure(holder string, err error) {
	msg := "<nil>"
	if err != nil {
		msg = err.Error()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = append(r.failures, failure{holder: holder, err: msg})
}

// addOp records one register operation; Register calls it.
func (r *Recorder) addOp(op registerOp) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, op)
}

// recording is a copy of everything recorded so far, so that checks and
// reports run without holding the lock while holders keep recording.
type recording struct {
	holds    []Hold
	faults   []Fault
	ops      []registerOp
	failures []failure
}

func (r *Recorder) snapshot() recording {
	r.mu.Lock()
	defer r.mu.Unlock()
	return recording{
		holds:    slices.Clone(r.holds),
		faults:   slices.Clone(r.faults),
		ops:      slices.Clone(r.ops),
		failures: slices.Clone(r.failures),
	}
}
