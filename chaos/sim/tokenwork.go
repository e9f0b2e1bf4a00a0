package sim

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/redlease/redlease/idempotency"
)

// InvTokenOnce: an issued token is consumed at most once (at most one
// Consume of it returns nil), and when every Consume of it got an
// answer from the store (nil or ErrTokenUsed), exactly one was told nil:
// the call that used it up is never told ErrTokenUsed for its own
// consume (a reply lost and the call resent by go-redis, say).
const InvTokenOnce = "token-once"

func init() {
	// The tokens scenario takes no lock and runs no Barrier: of the
	// invariants registered so far (every file before this one, in file
	// name order, and examined.go's table), none applies to it.
	for _, inv := range slices.Collect(maps.Keys(examinedIn)) {
		f := examinedIn[inv]
		examinedIn[inv] = func(sc *Scenario) bool { return sc.Idem != IdemTokens && f(sc) }
	}
	examinedIn[InvTokenOnce] = func(sc *Scenario) bool { return sc.Idem == IdemTokens }
}

// tokenRec is one issued token and what each of its consumers was told.
type tokenRec struct {
	client, seq int
	tok         string
	errs        []error
	at          time.Duration
}

// tokenClient is one client of the tokens scenario: it issues Ops
// tokens on the store (node 0), and each is consumed by one consumer
// (half the time) or by two or three at once, each with a go-redis
// client of its own (ContextTimeoutEnabled drawn per consumer) and a ctx
// of 0.2, 5 or 15 s: long enough, mostly, for go-redis to resend a
// command whose reply was lost (its read timeout is 3 s) or whose
// connection was cut.
func (w *World) tokenClient(ci int, r *rand.Rand) {
	const consumers = 3
	var toks [consumers]*idempotency.Tokens
	for i := range consumers {
		c := w.redisClient(ci, w.nodes[w.sc.storeNode()], r.IntN(2) == 0)
		toks[i] = must(idempotency.NewTokens(c, "tok:"))
	}
	for seq := range w.sc.Ops {
		ictx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), ci, jitTokens, seq<<2), 10*time.Second)
		tok, err := toks[0].Issue(ictx, "s", 0)
		cancel()
		if err != nil {
			w.hist.logf("c%d#%d issue: %v", ci, seq, short(err))
			sleep(ms(r, 0, 10))
			continue
		}
		n := 1
		if r.IntN(2) == 0 {
			n = 2 + r.IntN(2)
		}
		rec := &tokenRec{client: ci, seq: seq, tok: tok, errs: make([]error, n)}
		var wg sync.WaitGroup
		for i := range n {
			d := []time.Duration{200 * time.Millisecond, 5 * time.Second, 15 * time.Second}[r.IntN(3)]
			wg.Go(func() {
				// Apart by a microsecond: two calls leaving at one instant
				// would dial in the Go scheduler's order.
				sleep(time.Duration(i) * time.Microsecond)
				ctx, cancel := context.WithTimeout(w.jitterCtx(context.Background(), ci, jitTokens, seq<<2|(i+1)), d)
				rec.errs[i] = toks[i].Consume(ctx, "s", tok)
				cancel()
				w.hist.logf("c%d#%d consumer %d (ctx %v): %v", ci, seq, i, d, short(rec.errs[i]))
			})
		}
		wg.Wait()
		rec.at = w.hist.now()
		w.idem.mu.Lock()
		w.idem.tokens = append(w.idem.tokens, *rec)
		w.idem.mu.Unlock()
		sleep(ms(r, 0, 10))
	}
}

// checkTokensLocked checks InvTokenOnce (w.idem.mu held).
func (w *World) checkTokensLocked() []Violation {
	var vs []Violation
	for _, t := range w.idem.tokens {
		ok, used, decided := 0, 0, true
		for _, err := range t.errs {
			switch {
			case err == nil:
				ok++
			case errors.Is(err, idempotency.ErrTokenUsed):
				used++
			default:
				decided = false
			}
		}
		if ok > 1 {
			vs = append(vs, Violation{Inv: InvTokenOnce, At: t.at, Detail: fmt.Sprintf("c%d#%d token %s: consumed %d times (%v)", t.client, t.seq, t.tok, ok, t.errs)})
		}
		if !decided {
			continue
		}
		w.hist.ex.count(InvTokenOnce, 1)
		if ok == 0 {
			vs = append(vs, Violation{Inv: InvTokenOnce, At: t.at, Detail: fmt.Sprintf("c%d#%d token %s: all %d consumers were told ErrTokenUsed, none that it consumed the token (%v)", t.client, t.seq, t.tok, len(t.errs), t.errs)})
		}
	}
	return vs
}
