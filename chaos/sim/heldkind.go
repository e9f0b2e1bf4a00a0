package sim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redlease/redlease"
)

// InvHeldKind: an acquisition the Locker's observer saw answered "held"
// (errors.Is redlease.ErrNotObtained and not redlease.ErrUnavailable)
// carries what a refusal carries: the holder's remaining TTL
// (*redlease.HeldError), a quorum's refusals (*redlease.QuorumError),
// the waiters ahead in fair mode (redlease.ErrQueued), a grant that came
// back with no validity left, or the attempt's ctx ending. A node that
// failed or a write its replicas did not acknowledge is an outage, never
// "held": the README's switch would take it for a holder, and the CLI
// exits 75 for it (issue 29, defect 4). Checked where the workloads'
// Lockers have the state observer (lockClient and doClient on failover,
// the ops clients, doClient on single, the Multi clients: a set's step,
// "acquire_set", as well as each key's acquisition). No fault excuses it. Examined:
// acquisitions answered "held".
const InvHeldKind = "held-kind"

func init() {
	examinedIn[InvHeldKind] = func(sc *Scenario) bool {
		return sc.Strategy == Failover && sc.Idem == ""
	}
}

// heldKind checks held-kind for one acquisition of client ci on key,
// started at t0 (virtual), answered err under ctx; one inside a
// CLUSTERDOWN window must be an outage (downAttempt, clusterdown.go).
func (w *World) heldKind(ctx context.Context, ci int, key string, t0 time.Duration, err error) {
	if w.downAttempt(ctx, ci, key, t0, err) {
		return
	}
	if !errors.Is(err, redlease.ErrNotObtained) || errors.Is(err, redlease.ErrUnavailable) {
		return
	}
	w.hist.ex.count(InvHeldKind, 1)
	var (
		he *redlease.HeldError
		qe *redlease.QuorumError
	)
	switch {
	case errors.As(err, &he), errors.As(err, &qe), errors.Is(err, redlease.ErrQueued):
		return
	case strings.Contains(err.Error(), "no validity left"):
		return
	case ctx.Err() != nil && errors.Is(err, context.Cause(ctx)):
		return
	}
	w.hist.violation(Violation{Inv: InvHeldKind, At: w.hist.now(), Detail: fmt.Sprintf(
		"c%d acquire %s: answered \"held\" (ErrNotObtained, not ErrUnavailable) with no refusal in it: %v", ci, key, err)})
}
