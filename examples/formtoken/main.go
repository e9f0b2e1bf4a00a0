// Command formtoken shows one-time form tokens (idempotency.Tokens): a
// checkout form carries a token, and of any number of submits of that
// form — a double click, a reload, twenty at once — exactly one goes
// through. The others learn that the token was used, which a page can
// answer with "already submitted" rather than an error.
//
// By default it runs against an in-process Redis (miniredis), so it needs
// no server:
//
//	go -C examples run ./formtoken
//
// -redis points it at a real Redis.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease/idempotency"
)

const (
	submits  = 20
	shortTTL = 200 * time.Millisecond
)

func main() {
	redisAddr := flag.String("redis", "", "address of a Redis for the tokens (default: in-process)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *redisAddr); err != nil {
		fmt.Fprintln(os.Stderr, "formtoken: FAILED:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr string) error {
	rdb, where, cleanup, err := connect(addr)
	if err != nil {
		return err
	}
	defer cleanup()
	tokens, err := idempotency.NewTokens(rdb, "redlease-form:"+strconv.FormatInt(time.Now().UnixNano(), 36)+":")
	if err != nil {
		return err
	}
	fmt.Printf("one-time tokens on %s\n\n", where)

	// A token is issued for a scope: this user's checkout form. It is
	// valid in that scope only.
	const scope = "alice:checkout"
	tok, err := tokens.Issue(ctx, scope, 10*time.Minute)
	if err != nil {
		return err
	}
	fmt.Printf("issued %s for %q\n", tok, scope)

	// 1. The form is submitted twenty times at once.
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		mu       sync.Mutex
		outcomes = map[string]int{}
	)
	for range submits {
		wg.Go(func() {
			<-start // all at the same moment
			err := tokens.Consume(ctx, scope, tok)
			mu.Lock()
			defer mu.Unlock()
			outcomes[describe(err)]++
		})
	}
	close(start)
	wg.Wait()
	fmt.Printf("\n1. %d concurrent submits of that token:\n", submits)
	for _, k := range []string{"ok", "ErrTokenUsed"} {
		fmt.Printf("   %-16s %2d\n", k, outcomes[k])
	}

	// 2. A token this form never issued: made up, or issued for another
	//    form (bob's token is no good on alice's form).
	bobs, err := tokens.Issue(ctx, "bob:checkout", 0)
	if err != nil {
		return err
	}
	madeUp := tokens.Consume(ctx, scope, "not-a-token")
	foreign := tokens.Consume(ctx, scope, bobs)
	fmt.Printf("\n2. a made-up token: %s;  bob's token on alice's form: %s\n", describe(madeUp), describe(foreign))

	// 3. A token past its expiry. The token carries its expiry, and
	//    Consume judges it by this process's clock; Redis forgets the token
	//    at the same moment, by its own clock. miniredis's FastForward would
	//    move only the server's clock (the token would look "unknown", not
	//    "expired"), so the demo issues a short-lived token and really
	//    waits, with miniredis expiring keys on the wall clock (ClockTTL).
	short, err := tokens.Issue(ctx, scope, shortTTL)
	if err != nil {
		return err
	}
	time.Sleep(shortTTL + 100*time.Millisecond)
	expired := tokens.Consume(ctx, scope, short)
	fmt.Printf("\n3. a token with a %v TTL, submitted %v later: %s\n", shortTTL, shortTTL+100*time.Millisecond, describe(expired))

	// The claim.
	var problems []error
	if outcomes["ok"] != 1 || outcomes["ErrTokenUsed"] != submits-1 {
		problems = append(problems, fmt.Errorf("concurrent submits: %v, want 1 ok and %d ErrTokenUsed", outcomes, submits-1))
	}
	if !errors.Is(madeUp, idempotency.ErrTokenUnknown) || !errors.Is(foreign, idempotency.ErrTokenUnknown) {
		problems = append(problems, fmt.Errorf("unknown tokens: %v and %v, want ErrTokenUnknown", madeUp, foreign))
	}
	if !errors.Is(expired, idempotency.ErrTokenExpired) {
		problems = append(problems, fmt.Errorf("expired token: %v, want ErrTokenExpired", expired))
	}
	if err := errors.Join(problems...); err != nil {
		return err
	}
	fmt.Println("\nexactly one submit went through; unknown and expired tokens were told apart: verified")
	return nil
}

// describe names Consume's answer.
func describe(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, idempotency.ErrTokenUsed):
		return "ErrTokenUsed"
	case errors.Is(err, idempotency.ErrTokenUnknown):
		return "ErrTokenUnknown"
	case errors.Is(err, idempotency.ErrTokenExpired):
		return "ErrTokenExpired"
	}
	return err.Error()
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
		m.ClockTTL(true) // keys expire on the wall clock, as on a real server
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
