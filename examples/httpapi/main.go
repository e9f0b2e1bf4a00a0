// Command httpapi serves POST /payments behind idempotency.Middleware, the
// IETF Idempotency-Key header for net/http: a client that retries a payment
// (a timeout, a double click) with the same key gets the first response
// back, marked Idempotent-Replayed, and is charged once.
//
// By default it starts itself on a free loopback port with an in-process
// Redis (miniredis), sends its own requests, prints them and exits:
//
//	go -C examples run ./httpapi
//
// With -serve it keeps serving, so you can try it by hand:
//
//	go -C examples run ./httpapi -serve 127.0.0.1:8080
//
//	curl -i http://127.0.0.1:8080/payments -H 'Authorization: Bearer alice' \
//	  -H 'Idempotency-Key: order-42' -d '{"to":"bob","amount":1250}'
//	# 201 Created, Location: /payments/pay_1
//	curl -i http://127.0.0.1:8080/payments -H 'Authorization: Bearer alice' \
//	  -H 'Idempotency-Key: order-42' -d '{"to":"bob","amount":1250}'
//	# 201 Created again, same body, Idempotent-Replayed: true; nobody was charged twice
//	curl -i http://127.0.0.1:8080/payments -H 'Authorization: Bearer alice' \
//	  -H 'Idempotency-Key: order-42' -d '{"to":"bob","amount":9999}'
//	# 422: the key was used for another request
//
// -redis points it at a real Redis for the idempotency records.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease/idempotency"
)

func main() {
	redisAddr := flag.String("redis", "", "address of the Redis that keeps idempotency records (default: in-process)")
	serve := flag.String("serve", "", "keep serving on this address (e.g. 127.0.0.1:8080) instead of running the demo requests")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *redisAddr, *serve); err != nil {
		fmt.Fprintln(os.Stderr, "httpapi: FAILED:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, redisAddr, serveAddr string) error {
	store, where, cleanup, err := connect(redisAddr)
	if err != nil {
		return err
	}
	defer cleanup()

	// The barrier keeps one record per (principal, route, key) on the
	// store; its in-flight lock is the default single strategy on the same
	// Redis. The prefix is new every run, so that a second run against a
	// real Redis does not replay the first run's payment.
	prefix := fmt.Sprintf("redlease-httpapi:%d:", time.Now().UnixNano())
	barrier, err := idempotency.New(store, idempotency.WithPrefix(prefix), idempotency.WithRetention(time.Hour))
	if err != nil {
		return err
	}
	bank := &processor{}
	keyed, err := idempotency.Middleware(barrier,
		// Keys are scoped per caller: alice's "order-42" is not bob's.
		idempotency.WithPrincipal(caller),
		// A payment without a key could not be retried safely: refuse it.
		idempotency.WithRequired(true),
	)
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", keyed(http.HandlerFunc(bank.create)))
	mux.HandleFunc("GET /payments/{id}", bank.get)

	demo := serveAddr == ""
	if demo {
		serveAddr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", serveAddr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	base := "http://" + ln.Addr().String()

	if !demo {
		fmt.Printf("serving POST %s/payments (records on %s); Ctrl-C to stop\n", base, where)
		<-ctx.Done()
		return nil
	}

	fmt.Printf("POST /payments behind idempotency.Middleware on %s, records on %s\n\n", base, where)
	first := send(ctx, base, "order-42", `{"to":"bob","amount":1250}`, "the first request")
	retry := send(ctx, base, "order-42", `{"to":"bob","amount":1250}`, "the client retries: same key, same body")
	reused := send(ctx, base, "order-42", `{"to":"bob","amount":9999}`, "same key, different body")
	unkeyed := send(ctx, base, "", `{"to":"bob","amount":1250}`, "no key at all")
	anonymous := sendAs(ctx, base, "", "order-42", `{"to":"bob","amount":1250}`, "alice's key, sent by nobody: keys are scoped to who sends them")

	// The claim.
	var problems []string
	check := func(ok bool, format string, args ...any) {
		if !ok {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	for _, r := range []*reply{first, retry, reused, unkeyed, anonymous} {
		if r.err != nil {
			return r.err
		}
	}
	check(first.status == http.StatusCreated && first.replayed == "", "first request: %d, replayed %q; want 201, not replayed", first.status, first.replayed)
	check(retry.status == http.StatusCreated && retry.replayed == "true", "retry: %d, replayed %q; want 201, replayed", retry.status, retry.replayed)
	check(bytes.Equal(first.body, retry.body), "the retry's body differs from the first's")
	check(first.location == retry.location && first.location != "", "Location %q then %q; want the same", first.location, retry.location)
	check(reused.status == http.StatusUnprocessableEntity, "same key, different body: %d; want 422", reused.status)
	check(unkeyed.status == http.StatusBadRequest, "no key: %d; want 400", unkeyed.status)
	check(anonymous.status == http.StatusUnauthorized && !bytes.Equal(anonymous.body, first.body), "a keyed request without a principal: %d; want 401, and never alice's response", anonymous.status)
	calls, payments := bank.count()
	check(calls == 1 && payments == 1, "the handler ran %d times and made %d payments; want 1 and 1", calls, payments)
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	fmt.Println("5 requests, the handler ran once, one payment made, nobody else read alice's response: verified")
	return nil
}

// caller is the authenticated principal. A real service takes it from a
// verified token; the demo trusts "Authorization: Bearer <name>".
func caller(r *http.Request) string {
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// processor makes payments. A real one would write to a database, passing
// the fence (examples/settlement shows the fence check).
type processor struct {
	mu       sync.Mutex
	calls    int // times the handler ran
	payments []payment
}

type payment struct {
	ID     string `json:"id"`
	From   string `json:"from"`
	To     string `json:"to"`
	Amount int64  `json:"amount"`
	Fence  uint64 `json:"fence"`
}

func (p *processor) create(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	p.calls++
	p.mu.Unlock()
	var req struct {
		To     string `json:"to"`
		Amount int64  `json:"amount"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.To == "" || req.Amount <= 0 {
		// A 4xx is recorded too: the same request would fail the same way.
		http.Error(w, "want {\"to\": name, \"amount\": cents > 0}", http.StatusBadRequest)
		return
	}
	fence, _ := idempotency.FenceFrom(r.Context())
	p.mu.Lock()
	pay := payment{ID: fmt.Sprintf("pay_%d", len(p.payments)+1), From: caller(r), To: req.To, Amount: req.Amount, Fence: fence}
	p.payments = append(p.payments, pay)
	p.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+pay.ID)
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(pay)
}

func (p *processor) get(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, pay := range p.payments {
		if pay.ID == r.PathValue("id") {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(pay)
			return
		}
	}
	http.NotFound(w, r)
}

// count returns how often the handler ran and how many payments it made.
func (p *processor) count() (calls, payments int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls, len(p.payments)
}

// reply is what the client saw.
type reply struct {
	status             int
	replayed, location string
	body               []byte
	err                error
}

// send POSTs body as alice with the given Idempotency-Key (none if empty)
// and prints the exchange.
func send(ctx context.Context, base, key, body, what string) *reply {
	return sendAs(ctx, base, "alice", key, body, what)
}

// sendAs is send on behalf of principal ("" sends no credentials).
func sendAs(ctx context.Context, base, principal, key, body, what string) *reply {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/payments", strings.NewReader(body))
	if err != nil {
		return &reply{err: err}
	}
	if principal != "" {
		req.Header.Set("Authorization", "Bearer "+principal)
	}
	req.Header.Set("Content-Type", "application/json")
	header := ""
	if key != "" {
		req.Header.Set(idempotency.HeaderIdempotencyKey, key)
		header = "  Idempotency-Key: " + key
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return &reply{err: err}
	}
	defer resp.Body.Close()
	rb, err := io.ReadAll(resp.Body)
	if err != nil {
		return &reply{err: err}
	}
	r := &reply{
		status:   resp.StatusCode,
		replayed: resp.Header.Get(idempotency.HeaderIdempotentReplayed),
		location: resp.Header.Get("Location"),
		body:     rb,
	}
	fmt.Printf("# %s\n> POST /payments%s  %s\n< %s", what, header, body, resp.Status)
	for _, h := range []string{"Content-Type", "Location", idempotency.HeaderIdempotentReplayed} {
		if v := resp.Header.Get(h); v != "" {
			fmt.Printf("  %s: %s", h, v)
		}
	}
	fmt.Printf("\n< %s\n\n", strings.TrimSpace(string(rb)))
	return r
}

// connect returns a client for addr, or for an in-process Redis.
func connect(addr string) (redis.UniversalClient, string, func(), error) {
	where := addr
	var closers []func()
	if addr == "" {
		m, err := miniredis.Run()
		if err != nil {
			return nil, "", nil, err
		}
		m.ClockTTL(true) // leases and retention run out as on a real server
		closers = append(closers, m.Close)
		addr, where = m.Addr(), "an in-process Redis"
	}
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	closers = append(closers, func() { _ = c.Close() })
	return c, where, func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}, nil
}
