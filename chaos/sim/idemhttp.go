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
// the transient 429, nor the 503). A replayed response whose Vary names
// a request field was negotiated for a request with this request's value
// of it; a duplicate whose value differs from the recorded request's is
// answered 409 negotiation-mismatch, marked replayed, and that answer
// goes only to a request of a negotiating key whose value differs from
// that of some run of the key that answered a recorded status.
// Examined: replayed responses (ExHTTPVary: those of a negotiating key;
// ExHTTPVaryDiffer: of those, the ones whose request differed).
const InvHTTPReplay = "http-replay"

// Counts beside InvHTTPReplay, which must not stay at zero over a
// scenario's seeds (examinedIn).
const (
	// ExHTTPVary: replayed answers (replays and negotiation mismatches)
	// to requests of a key whose handler negotiates, whose request's
	// value of the Vary field was compared with the recorded request's.
	ExHTTPVary = InvHTTPReplay + "/vary"
	// ExHTTPVaryDiffer: of those, the ones whose request's value differed
	// (the Middleware must answer negotiation-mismatch).
	ExHTTPVaryDiffer = InvHTTPReplay + "/vary-differ"
)

func init() {
	isHTTP := func(sc *Scenario) bool { return sc.Idem == IdemHTTP }
	examinedIn[InvHTTPReplay] = isHTTP
	examinedIn[ExHTTPVary] = isHTTP
	examinedIn[ExHTTPVaryDiffer] = isHTTP
}

// httpVaryNames are the request fields a key's handler may negotiate on,
// and httpVaryValues the values a client sends of each ("" for none: a
// client never sends an empty field).
var (
	httpVaryNames  = [...]string{"Accept-Language", "Accept"}
	httpVaryValues = [...][]string{{"en", "de", ""}, {"application/json", "text/plain", ""}}
)

// httpVaryOf is the request field the handler of key number n negotiates
// on: Accept-Language (n%3 == 0: Content-Language en or de), Accept
// (n%3 == 1: Content-Type JSON or plain text), or none ("").
func httpVaryOf(n int) string {
	if n%3 < len(httpVaryNames) {
		return httpVaryNames[n%3]
	}
	return ""
}

// negotiationMismatch says whether a response is the Middleware's 409
// "negotiation-mismatch": a duplicate whose request differs from the
// recorded one in a field the recorded response's Vary names.
func negotiationMismatch(status int, body string) bool {
	return status == http.StatusConflict && strings.Contains(body, `"negotiation-mismatch"`)
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
	vary     string            // the field its key's handler negotiates on ("": none)
	fields   map[string]string // the request's value of each of httpVaryNames ("": absent)
	want     int               // the status the handler answers, if it runs
	status   int               // the response's
	body     string
	replayed bool
	logged   []error // what the Middleware's error log reported for it
	end      time.Duration
}

// httpAnswer is a response a handler run returned, with the field its
// key's handler negotiated on and the value of it the request had.
type httpAnswer struct {
	key         string
	status      int
	vary, value string
}

type httpRunKey struct{}

// httpClient is one client of IdemHTTP: a Barrier (lease 30–60 ms, half
// of them renewed by a watchdog) and a
// Middleware on it, sending Ops POSTs on a few shared keys ("h…", a new set
// every second op), each retried up to three times until it gets a 201, a
// 422 or a negotiation mismatch. The caller's ctx lasts 10–120 ms; the
// Middleware does not heed it, and a caller whose ctx ended before the
// response came counts as gone (it retries). The handler works 1 ms to 0.8
// leases under its ctx (cut short, it answers 503 and does nothing),
// applies its effect to the fenced effect store when it answers 201, works
// 0–5 ms more, and answers the try's drawn status (httpStatuses) with a
// body naming its run; two keys in three negotiate (httpVaryOf): the
// handler names the field in Vary and its body and Content-Language or
// Content-Type follow the request's value of it. Each client prefers one
// value of each field and sends another (absent included) on one try in
// four, drawn from a lane of its own (vr), so other clients and its own
// retries of a key differ from the first request now and then.
func (w *World) httpClient(ci int, r *rand.Rand) {
	vr := rand.New(rand.NewPCG(w.seed, uint64(ci+1)<<8|0xa0)) // apart from doClient's and failover's lanes
	var prefer [len(httpVaryNames)]string
	for i, vals := range httpVaryValues {
		prefer[i] = vals[vr.IntN(len(vals)-1)] // never absent
	}
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
	w.hist.logf("c%d idem-http lease=%v storeEverything=%v renewed=%v ctxTimeouts=%v prefers=%q", ci, lease, everything, renews, ct, prefer)
	leaseMs := int(lease / time.Millisecond)
	for seq := range w.sc.Ops {
		kn := r.IntN(w.sc.Keys) + seq/2*w.sc.Keys
		key := fmt.Sprintf("h%d", kn)
		for try := range 4 {
			rec := &httpRunRec{run: effectRun{client: ci, seq: seq, try: try}, key: key, vary: httpVaryOf(kn), fields: map[string]string{},
				want: httpStatuses[r.IntN(len(httpStatuses))]}
			for i, name := range httpVaryNames {
				rec.fields[name] = prefer[i]
				if vr.IntN(4) == 0 {
					rec.fields[name] = httpVaryValues[i][vr.IntN(len(httpVaryValues[i]))]
				}
			}
			pre, post := ms(r, 1, leaseMs*8/10), ms(r, 0, 5)
			h := mw(http.HandlerFunc(func(hw http.ResponseWriter, hr *http.Request) {
				w.httpHandle(hw, hr, rec, pre, post)
			}))
			ctx, cancel := idemCallerCtx(w.jitterCtx(context.Background(), ci, jitBarrier, seq<<2|try), offGrid(r, ms(r, 10, 120)), (seq+try)%2 == 1, w.deadlineSkew(ci, seq<<2|try))
			req := httptest.NewRequestWithContext(context.WithValue(ctx, httpRunKey{}, rec), http.MethodPost, "/pay", strings.NewReader("amount=10"))
			req.Header.Set(idempotency.HeaderIdempotencyKey, key)
			for _, name := range httpVaryNames {
				if v := rec.fields[name]; v != "" {
					req.Header.Set(name, v)
				}
			}
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, req)
			gone := ctx.Err() != nil
			cancel()
			w.httpEnded(rec, rr)
			w.hist.logf("%s POST %s %s: %d replayed=%v gone=%v body=%q logged=%v", rec.run, key, rec.sent(), rec.status, rec.replayed, gone, rec.body, rec.logged)
			if !gone && (httpRecorded(rec.status) || negotiationMismatch(rec.status, rec.body)) {
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
	value := hr.Header.Get(rec.vary)
	switch rec.vary {
	case "Accept-Language":
		lang := "en"
		if strings.HasPrefix(value, "de") {
			lang = "de"
		}
		hw.Header().Set("Vary", rec.vary)
		hw.Header().Set("Content-Language", lang)
		body += " lang=" + lang
	case "Accept":
		hw.Header().Set("Vary", rec.vary)
		if value == "text/plain" {
			hw.Header().Set("Content-Type", "text/plain; charset=utf-8")
		} else {
			hw.Header().Set("Content-Type", "application/json")
			body = fmt.Sprintf(`{"run":%q}`, body)
		}
	}
	w.idem.mu.Lock()
	if w.idem.httpBodies == nil {
		w.idem.httpBodies = map[string]httpAnswer{}
	}
	w.idem.httpBodies[body] = httpAnswer{key: rec.key, status: rec.want, vary: rec.vary, value: value}
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

// sent is the request's values of httpVaryNames, for the log.
func (rec *httpRunRec) sent() string {
	var b strings.Builder
	for i, name := range httpVaryNames {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%q", name, rec.fields[name])
	}
	return b.String()
}

// checkHTTPLocked checks InvHTTPReplay; w.idem.mu is held.
func (w *World) checkHTTPLocked() []Violation {
	var vs []Violation
	ex := &w.hist.ex
	for _, rec := range w.idem.http {
		if !rec.replayed {
			if negotiationMismatch(rec.status, rec.body) {
				vs = append(vs, Violation{Inv: InvHTTPReplay, At: rec.end, Detail: fmt.Sprintf("%s POST %s: answered %d %q without Idempotent-Replayed",
					rec.run, rec.key, rec.status, rec.body)})
			}
			continue
		}
		ex.count(InvHTTPReplay, 1)
		if negotiationMismatch(rec.status, rec.body) {
			vs = append(vs, w.checkMismatchLocked(rec)...)
			continue
		}
		src, ok := w.idem.httpBodies[rec.body]
		if ok && src.vary != "" {
			ex.count(ExHTTPVary, 1)
			if v := rec.fields[src.vary]; v != src.value {
				ex.count(ExHTTPVaryDiffer, 1)
				vs = append(vs, Violation{Inv: InvHTTPReplay, At: rec.end, Detail: fmt.Sprintf("%s POST %s: replayed %d %q, negotiated for %s %q, to a request with %q (Vary: %s; the answer is 409 negotiation-mismatch)",
					rec.run, rec.key, rec.status, rec.body, src.vary, src.value, v, src.vary)})
			}
		}
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

// checkMismatchLocked checks a 409 negotiation-mismatch answered to rec:
// its key's handler negotiates, and some run of the key answered a
// recorded status to a request whose value of the negotiated field
// differs from rec's (the recorded response is one of those runs').
// w.idem.mu is held.
func (w *World) checkMismatchLocked(rec *httpRunRec) []Violation {
	if rec.vary == "" {
		return []Violation{{Inv: InvHTTPReplay, At: rec.end, Detail: fmt.Sprintf("%s POST %s: answered %d %q, yet the key's handler negotiates on nothing",
			rec.run, rec.key, rec.status, rec.body)}}
	}
	w.hist.ex.count(ExHTTPVary, 1)
	w.hist.ex.count(ExHTTPVaryDiffer, 1)
	v := rec.fields[rec.vary]
	for _, src := range w.idem.httpBodies {
		if src.key == rec.key && httpRecorded(src.status) && src.value != v {
			return nil
		}
	}
	return []Violation{{Inv: InvHTTPReplay, At: rec.end, Detail: fmt.Sprintf("%s POST %s: answered %d %q to a request with %s %q, the value of every run of the key that answered a recorded status",
		rec.run, rec.key, rec.status, rec.body, rec.vary, v)}}
}
