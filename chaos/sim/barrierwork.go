package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/renew"
)

// barrierClient is one Barrier workload client: its own idempotency
// Barrier on the store (node 0; the default single lock strategy there,
// kept by the client's own renew.Watchdog), sending Ops requests, each on
// one of a few shared keys, with a timeout of 20–150 ms and up to four
// tries (ErrInProgress, a timeout, an unavailable store: try again after
// a seeded pause). The handler works 5–100 ms, then, if its ctx is still
// live, applies its effect to a fenced effect store (refused under a
// fence below the key's highest) and returns.
func (w *World) barrierClient(ci int, r *rand.Rand) {
	wd, err := renew.New()
	if err != nil {
		panic(fmt.Sprintf("sim: renew.New: %v", err))
	}
	w.onClose(ci, func() { wd.Close() })
	store := w.redisClient(ci, w.nodes[w.sc.storeNode()], r.IntN(2) == 0)
	opts := []idempotency.Option{idempotency.WithLease(w.drawTTL(r)), idempotency.WithRetention(30 * time.Second)}
	if ci%2 == 0 {
		// Odd clients run without a Keeper: on a one-Redis store their
		// completion leaves the lock to expire (the Keeper's clients
		// complete, then release).
		// The keeper sees each lock (the state check tracks it while kept).
		opts = append(opts, idempotency.WithKeeper(trackKeeper{w: w, ci: ci, inner: wd, prefix: "idem:l:", place: lockPlace{nodes: []int{w.sc.storeNode()}, need: 1}}))
	}
	b, err := idempotency.New(store, opts...)
	if err != nil {
		panic(fmt.Sprintf("sim: idempotency.New: %v", err))
	}
	for seq := range w.sc.Ops {
		key := fmt.Sprintf("p%d", r.IntN(w.sc.Keys))
		req := idempotency.Request{Key: key, Fingerprint: "fp-" + key}
		for try := range 4 {
			run := effectRun{client: ci, seq: seq, try: try}
			work := ms(r, 5, 100)
			ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), ci, jitBarrier, seq<<2|try), ms(r, 20, 150))
			out, err := b.Do(ctx, req, func(hctx context.Context, fence uint64) ([]byte, error) {
				defer w.hist.handlerSpan(hctx, key, run, fence, nil)()
				if !sleepCtx(hctx, work) || hctx.Err() != nil {
					return nil, hctx.Err()
				}
				w.hist.effect(key, fence, run)
				return []byte(fmt.Sprintf("c%d#%d.%d", ci, seq, try)), nil
			})
			cancel()
			w.hist.runEnded(run, err)
			w.hist.logf("c%d#%d.%d barrier %s: replayed=%v fence=%d result=%q: %v", ci, seq, try, key, out.Replayed, out.Fence, out.Result, short(err))
			if err == nil || errors.Is(err, idempotency.ErrMismatch) {
				break
			}
			sleep(ms(r, 0, 40))
		}
		sleep(ms(r, 0, 20))
	}
}

// effectRun names one try of a Barrier client's request.
type effectRun struct{ client, seq, try int }

func (e effectRun) String() string { return fmt.Sprintf("c%d#%d.%d", e.client, e.seq, e.try) }

// effectRec is one effect the fenced effect store accepted.
type effectRec struct {
	run   effectRun
	fence uint64
	at    time.Duration
}

// effect offers a handler's effect to the fenced effect store of key: it
// refuses a fence below the highest it accepted (a stale run), as the
// storage a Barrier's fences protect would.
func (h *history) effect(key string, fence uint64, run effectRun) {
	h.mu.Lock()
	ok := fence >= h.effFence[key]
	if ok {
		h.effFence[key] = fence
		h.effects[key] = append(h.effects[key], effectRec{run, fence, h.nowLocked()})
	}
	h.mu.Unlock()
	h.logf("%s effect %s fence=%d accepted=%v", run, key, fence, ok)
}

// runEnded records what Do returned to a run's caller.
func (h *history) runEnded(run effectRun, err error) {
	h.mu.Lock()
	h.runErr[run] = err
	h.mu.Unlock()
}

// unknownOutcome: Do told the caller its handler's outcome is unknown
// (the documented limit of the Barrier: a cancelled run, or a result the
// store never took), so a later run of the same key is allowed.
func unknownOutcome(err error) bool {
	return errors.Is(err, idempotency.ErrRunCancelled) || errors.Is(err, idempotency.ErrNotRecorded)
}

// unknownLocked says whether run's caller was left without its outcome
// (unknownOutcome), or left it: its ctx ended while the handler ran, and
// a Barrier that runs the handler on under its lock (rather than
// cancelling it with the caller's ctx) answered with the ctx's error.
// The handler's outcome is then recorded only if the run keeps its lock
// and the store takes it; a run the workload knows must have been
// recorded (mustRecord) excuses nothing.
func (h *history) unknownLocked(run effectRun) bool {
	err := h.runErr[run]
	if unknownOutcome(err) {
		return true
	}
	left := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
	return left && (h.mustRecord == nil || !h.mustRecord(run))
}

// twiceLocked finds keys whose effect the store accepted more than once,
// where no earlier run of the key ended with an unknown outcome.
func (h *history) twiceLocked() []Violation {
	var vs []Violation
	for _, k := range sortedKeys(h.effects) {
		es := h.effects[k]
		h.ex.count(InvTwice, len(es))
		for i := 1; i < len(es); i++ {
			excused := false
			for _, p := range es[:i] {
				if h.unknownLocked(p.run) {
					excused = true
				}
			}
			if excused {
				h.excused++
				continue
			}
			p := es[i-1]
			vs = append(vs, Violation{Inv: InvTwice, At: es[i].at, Detail: fmt.Sprintf("idempotency key %s: effect of %s (fence %d) after that of %s (fence %d at %.3fms, Do returned %v)",
				k, es[i].run, es[i].fence, p.run, p.fence, msf(p.at), short(h.runErr[p.run]))})
		}
	}
	return vs
}

func (h *history) effectCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, es := range h.effects {
		n += len(es)
	}
	return n
}

// handlerSpan is the time a Barrier handler believed it ran alone for its
// key: from its start until its ctx ended or it returned.
type handlerSpan struct {
	key      string
	run      effectRun
	fence    uint64
	from, to time.Duration // to < 0: not ended yet
}

// handlerStart records a handler's start.
func (h *history) handlerStart(key string, run effectRun, fence uint64) *handlerSpan {
	h.mu.Lock()
	defer h.mu.Unlock()
	sp := &handlerSpan{key: key, run: run, fence: fence, from: h.nowLocked(), to: -1}
	h.spans[key] = append(h.spans[key], sp)
	return sp
}

// handlerSpan records a handler's span (handlerStart) and returns the
// function its handler defers: the span ends when ctx ends or the handler
// returns, whichever comes first. onCut, if not nil, runs when ctx ends
// first (the handler cut while it ran), and has run when the handler
// returns. A handler that returns as its ctx ends (it waited on ctx) is
// cut: ctx's AfterFunc starts its goroutine after ctx's Done is closed,
// so the handler's return may stop it first, in the Go scheduler's order
// (idem-mixed 17, one run in 40 under load: no "handler cut" line); the
// returned function then runs the cut itself. It waits for an AfterFunc
// that started, so that the cut reads the lock before the Barrier, which
// the handler's return lets go on, releases it.
func (h *history) handlerSpan(ctx context.Context, key string, run effectRun, fence uint64, onCut func()) (returned func()) {
	span := h.handlerStart(key, run, fence)
	cut := func() {
		h.handlerEnd(span)
		if onCut != nil {
			onCut()
		}
	}
	ran := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(ran)
		cut()
	})
	return func() {
		switch {
		case !stop():
			<-ran
		case ctx.Err() != nil:
			cut()
		default:
			h.handlerEnd(span)
		}
	}
}

// handlerEnd records the end of a handler's belief: its ctx ended or it
// returned, whichever came first.
func (h *history) handlerEnd(sp *handlerSpan) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if sp.to < 0 {
		sp.to = h.nowLocked()
	}
}

// handlerOverlapLocked finds two handlers of one key that both believed
// they ran alone at the same moment: the second began before the first's
// ctx was cancelled (its lock lost) and before it returned. Within the
// strategy's assumptions the Barrier's lock makes that impossible: a
// handler's ctx ends when its lock's Lost closes, before its validity
// ends, and the store grants the key to nobody else before then.
func (h *history) handlerOverlapLocked() []Violation {
	var vs []Violation
	for _, k := range sortedKeys(h.spans) {
		sp := h.spans[k]
		for i, a := range sp {
			h.ex.count(InvHandlerOverlap, len(sp)-i-1)
			for _, b := range sp[i+1:] {
				aEnd, bEnd := a.to, b.to
				if aEnd < 0 {
					aEnd = h.nowLocked()
				}
				if bEnd < 0 {
					bEnd = h.nowLocked()
				}
				if a.from < bEnd && b.from < aEnd {
					first, second := a, b
					if second.from < first.from {
						first, second = second, first
					}
					vs = append(vs, Violation{Inv: InvHandlerOverlap, At: second.from, Detail: fmt.Sprintf("idempotency key %s: handler %s (fence %d) began at %.3fms while %s (fence %d, began %.3fms) still ran with a live ctx until %.3fms",
						k, second.run, second.fence, msf(second.from), first.run, first.fence, msf(first.from), msf(min(aEnd, bEnd)))})
				}
			}
		}
	}
	return vs
}
