package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/redlease/redlease/idempotency"
	"github.com/redlease/redlease/renew"
)

// IdemHTTP: every client's idempotency.Middleware (WithGlobalKeys, one
// route) on a Barrier of its own on the store's lock, half of them
// WithStoreEverything, called in process (httptest; the Barrier's Redis
// traffic crosses the simulated network).
const IdemHTTP = "http"

// InvHTTPReplay: a response marked Idempotent-Replayed has the status and
// body of a response a handler run of its key returned, and that status
// is one the Middleware records (201 or 422 here; never the relayed 409,
// the transient 429, nor the 503). Examined: replayed responses.
const InvHTTPReplay = "http-replay"

func init() {
	examinedIn[InvHTTPReplay] = func(sc *Scenario) bool { return sc.Idem == IdemHTTP }
}

// httpStatuses are what the inner handler answers, drawn per try: 201
// (the effect made; recorded), 409 with Retry-After (a downstream's
// in-progress, relayed; not recorded), 429 and 503 (transient; not
// recorded), 422 (a refusal; recorded).
var httpStatuses = [...]int{http.StatusCreated, http.StatusCreated, http.StatusConflict, http.StatusTooManyRequests,
	http.StatusServiceUnavailable, http.StatusUnprocessableEntity}

// httpRecorded says whether the Middleware records a handler's status.
func httpRecorded(status int) bool {
	return status == http.StatusCreated || status == http.StatusUnprocessableEntity
}

// httpRunRec is one try of an IdemHTTP client's request.
type httpRunRec struct {
	run      effectRun
	key      string
	want     int // the status the handler answers, if it runs
	status   int // the response's
	body     string
	replayed bool
	logged   []error // what the Middleware's error log reported for it
	end      time.Duration
}

// httpAnswer is a response a handler run returned.
type httpAnswer struct {
	key    string
	status int
}

type httpRunKey struct{}

// httpClient is one client of IdemHTTP: a Barrier (lease 30–60 ms, half
// of them renewed by a watchdog) and a
// Middleware on it, sending Ops POSTs on a few shared keys ("h…", a new set
// every second op), each retried up to three times until it gets a 201 or
// a 422. The caller's ctx lasts 10–120 ms; the Middleware does not heed
// it, and a caller whose ctx ended before the response came counts as
// gone (it retries). The handler works 1 ms to 0.8 leases under its ctx
// (cut short, it answers 503 and does nothing), applies its effect to the
// fenced effect store when it answers 201, works 0–5 ms more, and answers
// the try's drawn status (httpStatuses) with a body naming its run.
func (w *World) httpClient(ci int, r *rand.Rand) {
	ct := r.IntN(2) == 0
	store := w.redisClient(ci, w.nodes[w.sc.storeNode()], ct)
	lease := ms(r, 30, 60).Truncate(time.Millisecond)
	everything := ci%2 == 0
	opts := []idempotency.Option{idempotency.WithLease(lease), idempotency.WithRetention(30 * time.Second)}
	if everything {
		opts = append(opts, idempotency.WithStoreEverything())
	}
	// Half the clients renew their locks (a renew.Watchdog, through a
	// Keeper that state-valid tracks): their handler timeout is the
	// Middleware's default; the others' is two thirds of the lease.
	renews := r.IntN(2) == 0
	if renews {
		wd := must(renew.New())
		w.onClose(ci, func() { wd.Close() })
		place := lockPlace{nodes: []int{w.sc.storeNode()}, need: 1}
		opts = append(opts, idempotency.WithKeeper(trackKeeper{w: w, ci: ci, inner: wd, prefix: "idem:l:", place: place}))
	}
	b := must(idempotency.New(store, opts...))
	mw := must(idempotency.Middleware(b, idempotency.WithGlobalKeys(),
		idempotency.WithRoute(func(*http.Request) string { return "POST /pay" }),
		idempotency.WithErrorLog(func(req *http.Request, err error) {
			if rec, ok := req.Context().Value(httpRunKey{}).(*httpRunRec); ok {
				w.idem.mu.Lock()
				rec.logged = append(rec.logged, err)
				w.idem.mu.Unlock()
			}
		})))
	w.hist.logf("c%d idem-http lease=%v storeEverything=%v renewed=%v ctxTimeouts=%v", ci, lease, everything, renews, ct)
	leaseMs := int(lease / time.Millisecond)
	for seq := range w.sc.Ops {
		key := fmt.Sprintf("h%d", r.IntN(w.sc.Keys)+seq/2*w.sc.Keys)
		for try := range 4 {
			rec := &httpRunRec{run: effectRun{client: ci, seq: seq, try: try}, key: key, want: httpStatuses[r.IntN(len(httpStatuses))]}
			pre, post := ms(r, 1, leaseMs*8/10), ms(r, 0, 5)
			h := mw(http.HandlerFunc(func(hw http.ResponseWriter, hr *http.Request) {
				w.httpHandle(hw, hr, rec, pre, post)
			}))
			ctx, cancel := idemCallerCtx(w.jitterCtx(context.Background(), ci, jitBarrier, seq<<2|try), ms(r, 10, 120), (seq+try)%2 == 1)
			req := httptest.NewRequestWithContext(context.WithValue(ctx, httpRunKey{}, rec), http.MethodPost, "/pay", strings.NewReader("amount=10"))
			req.Header.Set(idempotency.HeaderIdempotencyKey, key)
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, req)
			gone := ctx.Err() != nil
			cancel()
			w.httpEnded(rec, rr)
			w.hist.logf("%s POST %s: %d replayed=%v gone=%v body=%q logged=%v", rec.run, key, rec.status, rec.replayed, gone, rec.body, rec.logged)
			if !gone && httpRecorded(rec.status) {
				break
			}
			sleep(ms(r, 0, 20))
		}
		sleep(ms(r, 0, 10))
	}
}

// httpHandle is the inner handler of rec's try.
func (w *World) httpHandle(hw http.ResponseWriter, hr *http.Request, rec *httpRunRec, pre, post time.Duration) {
	hctx := hr.Context()
	fence, _ := idempotency.FenceFrom(hctx)
	defer w.hist.handlerSpan(hctx, rec.key, rec.run, fence, nil)()
	if !sleepCtx(hctx, pre) {
		hw.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if rec.want == http.StatusCreated {
		w.hist.effect(rec.key, fence, rec.run)
	}
	sleep(post)
	body := fmt.Sprintf("%s %s %d fence=%d", rec.run, rec.key, rec.want, fence)
	w.idem.mu.Lock()
	if w.idem.httpBodies == nil {
		w.idem.httpBodies = map[string]httpAnswer{}
	}
	w.idem.httpBodies[body] = httpAnswer{key: rec.key, status: rec.want}
	w.idem.mu.Unlock()
	if rec.want == http.StatusConflict || rec.want == http.StatusTooManyRequests {
		hw.Header().Set("Retry-After", "1")
	}
	hw.WriteHeader(rec.want)
	_, _ = io.WriteString(hw, body)
}

// httpEnded records rec's response, and tells effect-twice what became of
// the run: unknown (ErrRunCancelled) when the Middleware answered
// outcome-unknown, what its error log reported otherwise (ErrNotRecorded:
// unknown too), nil when it reported nothing.
func (w *World) httpEnded(rec *httpRunRec, rr *httptest.ResponseRecorder) {
	end := w.hist.now()
	w.idem.mu.Lock()
	rec.status, rec.body, rec.end = rr.Code, rr.Body.String(), end
	rec.replayed = rr.Header().Get(idempotency.HeaderIdempotentReplayed) == "true"
	err := errors.Join(rec.logged...)
	if rec.status == http.StatusServiceUnavailable && strings.Contains(rec.body, "outcome-unknown") {
		err = errors.Join(idempotency.ErrRunCancelled, err)
	}
	w.idem.http = append(w.idem.http, rec)
	w.idem.mu.Unlock()
	w.hist.runEnded(rec.run, err)
}

// checkHTTPLocked checks InvHTTPReplay; w.idem.mu is held.
func (w *World) checkHTTPLocked() []Violation {
	var vs []Violation
	for _, rec := range w.idem.http {
		if !rec.replayed {
			continue
		}
		w.hist.ex.count(InvHTTPReplay, 1)
		src, ok := w.idem.httpBodies[rec.body]
		switch {
		case !ok || src.key != rec.key:
			vs = append(vs, Violation{Inv: InvHTTPReplay, At: rec.end, Detail: fmt.Sprintf("%s POST %s: replayed %d %q, which no handler of the key returned", rec.run, rec.key, rec.status, rec.body)})
		case src.status != rec.status:
			vs = append(vs, Violation{Inv: InvHTTPReplay, At: rec.end, Detail: fmt.Sprintf("%s POST %s: replayed %q with status %d; its handler answered %d", rec.run, rec.key, rec.body, rec.status, src.status)})
		case !httpRecorded(src.status):
			vs = append(vs, Violation{Inv: InvHTTPReplay, At: rec.end, Detail: fmt.Sprintf("%s POST %s: replayed a %d %q, a status the Middleware must not record", rec.run, rec.key, rec.status, rec.body)})
		}
	}
	return vs
}
