// Command mqconsumer makes an at-least-once Redis Streams consumer group
// take effect once per business message, with idempotency.Consumer.
//
// A stream delivers at least once: a producer that timed out publishes the
// same order again (a new entry id), and XAUTOCLAIM hands a message to a
// second consumer when the first one has not acked it for a while — maybe
// because it died, maybe because it is still working. Handle is keyed on
// the order id the message carries, not on the entry id, and its answer says
// whether to ack:
//
//   - a duplicate publish is replayed, not applied again, and acked;
//   - a message claimed while its first consumer is still running gets
//     ErrInProgress with ack=false: not acked, so it stays pending;
//   - claimed again once the first consumer finished (which then died
//     before its own XACK), it replays and is acked.
//
// By default it runs against an in-process Redis (miniredis, which
// implements XAUTOCLAIM with real idle times), so it needs no server:
//
//	go -C examples run ./mqconsumer
//
// -redis points it at a real Redis (5.0 or later; XAUTOCLAIM needs 6.2).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease/idempotency"
)

// A consumer that has not acked a message for minIdle is presumed dead,
// and XAUTOCLAIM gives the message to another. The slow order takes longer
// than that, on purpose.
const (
	minIdle   = 200 * time.Millisecond
	slowOrder = time.Second
)

func main() {
	redisAddr := flag.String("redis", "", "address of a Redis for the stream and the records (default: in-process)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *redisAddr); err != nil {
		fmt.Fprintln(os.Stderr, "mqconsumer: FAILED:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr string) error {
	rdb, where, cleanup, err := connect(addr)
	if err != nil {
		return err
	}
	defer cleanup()

	// One stream, group and record prefix per run, so that a second run on
	// a real Redis starts clean.
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	stream, group := "redlease-mq:"+run+":orders", "ledger"
	barrier, err := idempotency.New(rdb, idempotency.WithPrefix("redlease-mq:"+run+":idem:"), idempotency.WithRetention(time.Hour))
	if err != nil {
		return err
	}
	dedup, err := idempotency.NewConsumer(barrier)
	if err != nil {
		return err
	}
	if err := rdb.XGroupCreateMkStream(ctx, stream, group, "0").Err(); err != nil {
		return err
	}
	fmt.Printf("stream %s, group %q, on %s\n\n", stream, group, where)

	book := &ledger{applied: map[string]int{}}
	c := &consumer{rdb: rdb, stream: stream, group: group, dedup: dedup, book: book}

	// 1. Duplicate publishes. The producer timed out on order-2 and order-5
	//    and published them again: new entry ids, same order ids.
	fmt.Println("1. a producer publishes six orders, and order-2 and order-5 twice")
	for _, order := range []string{"order-1", "order-2", "order-3", "order-4", "order-5", "order-6", "order-2", "order-5"} {
		if err := publish(ctx, rdb, stream, order); err != nil {
			return err
		}
	}
	msgs, err := c.read(ctx, "A")
	if err != nil {
		return err
	}
	for _, m := range msgs {
		if _, err := c.handle(ctx, "A", m, true); err != nil {
			return err
		}
	}

	// 2. A redelivery while the first consumer is still at work. A takes
	//    order-7, whose handler is slow; B's XAUTOCLAIM finds it idle past
	//    minIdle and claims it.
	fmt.Printf("\n2. consumer A takes order-7 (its handler takes %v); B claims it with XAUTOCLAIM after %v idle\n", slowOrder, minIdle)
	if err := publish(ctx, rdb, stream, "order-7"); err != nil {
		return err
	}
	msgs, err = c.read(ctx, "A")
	if err != nil || len(msgs) != 1 {
		return fmt.Errorf("consumer A read %d messages (%v), want order-7", len(msgs), err)
	}
	var aDone sync.WaitGroup
	var aErr error
	aDone.Go(func() {
		// A finishes the work, then dies before its XACK (a crash, a lost
		// connection): the message stays pending. Had A lived, its XACK
		// would have settled the matter, for XACK is per group, not per
		// consumer.
		_, aErr = c.handle(ctx, "A", msgs[0], false)
	})
	time.Sleep(minIdle + 100*time.Millisecond)
	inProgress, err := c.claim(ctx, "B")
	if err != nil {
		return err
	}
	aDone.Wait()
	if aErr != nil {
		return aErr
	}

	// 3. After A finished, B claims it once more: now it replays, and B
	//    acks it.
	fmt.Println("\n3. A has finished (and died before its XACK); B claims order-7 again")
	time.Sleep(minIdle + 50*time.Millisecond)
	replayed, err := c.claim(ctx, "B")
	if err != nil {
		return err
	}

	// The claim.
	pending, err := rdb.XPending(ctx, stream, group).Result()
	if err != nil {
		return err
	}
	fmt.Printf("\norders applied: %s\n", book)
	fmt.Printf("messages handled %d, acked %d, still pending %d\n", c.handled, c.acked, pending.Count)
	var problems []error
	for i := 1; i <= 7; i++ {
		if n := book.applied[fmt.Sprintf("order-%d", i)]; n != 1 {
			problems = append(problems, fmt.Errorf("order-%d applied %d times", i, n))
		}
	}
	if len(inProgress) != 1 || !errors.Is(inProgress[0].err, idempotency.ErrInProgress) || inProgress[0].ack {
		problems = append(problems, fmt.Errorf("the claim while A ran: %+v, want one message, ErrInProgress, no ack", inProgress))
	}
	if len(replayed) != 1 || replayed[0].err != nil || !replayed[0].ack {
		problems = append(problems, fmt.Errorf("the claim after A finished: %+v, want one message, acked", replayed))
	}
	if pending.Count != 0 {
		problems = append(problems, fmt.Errorf("%d messages still pending", pending.Count))
	}
	if err := errors.Join(problems...); err != nil {
		return err
	}
	fmt.Println("every order applied once, every message acked: verified")
	return nil
}

func publish(ctx context.Context, rdb redis.UniversalClient, stream, order string) error {
	id, err := rdb.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: map[string]any{"order": order, "amount": "1250"}}).Result()
	if err == nil {
		fmt.Printf("   XADD %-16s %s\n", id, order)
	}
	return err
}

// consumer is one process of the group; the name says which.
type consumer struct {
	rdb           redis.UniversalClient
	stream, group string
	dedup         *idempotency.Consumer
	book          *ledger

	mu             sync.Mutex
	handled, acked int
}

// result is what Handle said for one message.
type result struct {
	entry string
	ack   bool
	err   error
}

// read takes new messages for consumer name (XREADGROUP >).
func (c *consumer) read(ctx context.Context, name string) ([]redis.XMessage, error) {
	streams, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
		Group: c.group, Consumer: name, Streams: []string{c.stream, ">"}, Count: 100, Block: -1,
	}).Result()
	if errors.Is(err, redis.Nil) || len(streams) == 0 {
		return nil, nil // nothing new
	}
	if err != nil {
		return nil, err
	}
	return streams[0].Messages, nil
}

// claim takes over, for consumer name, every message idle for minIdle
// (XAUTOCLAIM) and handles them.
func (c *consumer) claim(ctx context.Context, name string) ([]result, error) {
	msgs, _, err := c.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
		Stream: c.stream, Group: c.group, Consumer: name, MinIdle: minIdle, Start: "0-0", Count: 100,
	}).Result()
	if err != nil {
		return nil, err
	}
	var out []result
	for _, m := range msgs {
		r, err := c.handle(ctx, name, m, true)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// handle runs one message through the dedup consumer, keyed on the order
// id it carries, and acks it if Handle says so (and ackAllowed: a consumer
// that dies before its XACK). An error return means something unexpected;
// ErrInProgress and friends are part of result.
func (c *consumer) handle(ctx context.Context, name string, m redis.XMessage, ackAllowed bool) (result, error) {
	order, _ := m.Values["order"].(string)
	if order == "" {
		return result{}, fmt.Errorf("entry %s carries no order id", m.ID)
	}
	var fence uint64
	replay := true
	ack, err := c.dedup.Handle(ctx, order, func(ctx context.Context, f uint64) ([]byte, error) {
		replay, fence = false, f
		if order == "order-7" {
			select { // a slow downstream
			case <-time.After(slowOrder):
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		}
		c.book.apply(order)
		return []byte("applied " + order), nil
	})
	r := result{entry: m.ID, ack: ack, err: err}
	what := "applied (fence " + strconv.FormatUint(fence, 10) + ")"
	switch {
	case errors.Is(err, idempotency.ErrInProgress):
		what = "in progress elsewhere"
	case err != nil:
		return r, fmt.Errorf("%s %s %s: %w", name, m.ID, order, err)
	case replay:
		what = "duplicate: replayed"
	}
	verdict := "do not ack"
	if ack && ackAllowed {
		if err := c.rdb.XAck(ctx, c.stream, c.group, m.ID).Err(); err != nil {
			return r, err
		}
		verdict = "XACK"
	} else if ack {
		verdict = "ack due, but the consumer dies first"
	}
	c.mu.Lock()
	c.handled++
	if verdict == "XACK" {
		c.acked++
	}
	c.mu.Unlock()
	fmt.Printf("   %s  %-16s %-8s %-24s → %s\n", name, m.ID, order, what, verdict)
	return r, nil
}

// ledger is the effect: how often each order was applied.
type ledger struct {
	mu      sync.Mutex
	applied map[string]int
}

func (l *ledger) apply(order string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.applied[order]++
}

func (l *ledger) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	orders := make([]string, 0, len(l.applied))
	for o := range l.applied {
		orders = append(orders, o)
	}
	sort.Strings(orders)
	parts := make([]string, len(orders))
	for i, o := range orders {
		parts[i] = fmt.Sprintf("%s×%d", o, l.applied[o])
	}
	return strings.Join(parts, " ")
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
