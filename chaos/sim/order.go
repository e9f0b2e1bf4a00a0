package sim

import (
	"context"
	"math"
	"slices"
	"strconv"
	"sync"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

// orderHook lets the commands a go-redis client starts at one virtual
// instant take pooled connections, or queue for new ones, in an order of
// the seed: each command (but a connection's HELLO) passes the run's
// turnstile before it asks the client's pool for a connection, in the
// order of a key drawn from the seed, its client, its target and its
// content. Without it, goroutines woken together (the library's fan-out
// workers when one ctx ends, an Extend and a renewal of one lock) took
// the pool's idle connections, or queued for new ones, in the Go
// scheduler's order; go-redis hands a dial's connection to the request at
// the front of its queue, so which request went out on which connection,
// and which one waited for a dial, followed the scheduler.
type orderHook struct {
	turn  *turnstile
	group uint64 // the go-redis client: one command of a group at a time
	key   uint64 // mix(seed, client, target)
}

// orderHookFor is the orderHook of client ci's go-redis client to target.
func (w *World) orderHookFor(ci int, target uint64) orderHook {
	return orderHook{turn: w.net.turn, group: uint64(ci+2)<<32 | target, key: mix(mix(w.seed, 0x07de7), uint64(ci+2)<<32|target)}
}

func (h orderHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h orderHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "hello" {
			// A connection's handshake, run by go-redis on the
			// connection the command that dialled it got (a PubSub's
			// holding its mutex: see the Wake handshake in World.fate).
			return next(ctx, cmd)
		}
		k := argsHash(cmd.Args())
		live := ctx.Err() == nil
		h.turn.pass(h.group, mix(h.key, k))
		err := next(ctx, cmd)
		h.settle(ctx, live, err, k)
		return err
	}
}

func (h orderHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 {
			return next(ctx, cmds)
		}
		k := uint64(len(cmds))
		for _, c := range cmds {
			k = mix(k, argsHash(c.Args()))
		}
		live := ctx.Err() == nil
		h.turn.pass(h.group, mix(h.key, k))
		err := next(ctx, cmds)
		h.settle(ctx, live, err, k)
		return err
	}
}

// settle, when ctx ended while the command ran (live: its ctx had not
// ended when it started), sleeps 1-4096 ns more, drawn from its key, so
// that the callers one ctx deadline (or cancel) ends get their answers
// one after the other in an order of the seed, after the goroutines that
// ctx wakes without a command (the one that decides what to do next may
// look at what those callers left, such as the failover Watcher's
// per-Sentinel busy flag). A blocked Read already notices a deadline
// settle late (conn); a command waiting for a connection does not. A
// command started with its ctx already ended returns at once, as it does
// without the hook: a loop that tries again after its ctx ended (the
// Barrier's record renewal, whose select may take a pending tick before
// the ctx's end) takes no time doing so.
func (h orderHook) settle(ctx context.Context, live bool, err error, content uint64) {
	if !live || err == nil || ctx.Err() == nil {
		return
	}
	time.Sleep(time.Duration(1 + mix(mix(h.key, content), 0x5e771e)%maxSettle))
}

// argsHash is FNV-1a over a command's arguments as go-redis holds them.
func argsHash(args []any) uint64 {
	h := uint64(14695981039346656037)
	add := func(s string) {
		h ^= uint64(len(s))
		h *= 1099511628211
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= 1099511628211
		}
	}
	for _, a := range args {
		switch v := a.(type) {
		case string:
			add(v)
		case []byte:
			add(string(v))
		case int:
			add(strconv.Itoa(v))
		case int64:
			add(strconv.FormatInt(v, 10))
		case uint64:
			add(strconv.FormatUint(v, 10))
		case float64:
			add(strconv.FormatUint(math.Float64bits(v), 16))
		case time.Duration:
			add(strconv.FormatInt(int64(v), 10))
		default:
			add("?")
		}
	}
	return h
}

// settleInstant returns once every other goroutine of the run has gone as far
// as it can at this virtual instant, without taking virtual time: what
// client ci's last step started (a keeper's first renewal, which reads
// the lock's TTL) has then read what it reads and waits at the turnstile
// or for the network, so the client's next step (an Extend, which
// changes that TTL) follows it in every run of the seed.
func (w *World) settleInstant(ci int) { w.net.turn.pass(1<<63|uint64(ci), 0) }

// turnstile lets the commands the orderHooks of a run hold through at one
// virtual instant, without taking virtual time: a goroutine of its own
// waits (synctest.Wait) until every other goroutine of the bubble is
// durably blocked, so that every command started at that instant, and
// everything else that instant woke, has arrived or blocked; it then lets
// through, of each group (a go-redis client) with a command waiting, the
// one with the lowest order key; while any still waits, it waits again
// and lets the next ones through. The
// commands of one group thus ask the pool one at a time, each after the
// last one took an idle connection or queued for a dial and blocked, in
// the order of their keys; the commands of different groups, which share
// no pool, go together. Two commands of one group with one key (one
// content) go in the order they arrived.
type turnstile struct {
	mu      sync.Mutex
	waiting []ticket
	closed  bool
	kick    chan struct{} // cap 1: a command arrived
	stop    chan struct{}
	done    chan struct{}
}

// ticket is one command waiting at a turnstile.
type ticket struct {
	group, order uint64
	ch           chan struct{} // closed to let it through
}

// newTurnstile starts a run's turnstile (inside its bubble).
func newTurnstile() *turnstile {
	t := &turnstile{kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go t.loop()
	return t
}

// pass returns when the turnstile lets a command of group with order key
// order through (at once once the turnstile is closed).
func (t *turnstile) pass(group, order uint64) {
	ch := make(chan struct{})
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.waiting = append(t.waiting, ticket{group, order, ch})
	t.mu.Unlock()
	select {
	case t.kick <- struct{}{}:
	default:
	}
	<-ch
}

// loop lets the waiting commands through, round by round, until close.
func (t *turnstile) loop() {
	defer close(t.done)
	var round []chan struct{}
	for {
		select {
		case <-t.kick:
		case <-t.stop:
			return
		}
		for {
			synctest.Wait()
			select {
			case <-t.kick: // seen below
			default:
			}
			t.mu.Lock()
			round = t.nextLocked(round[:0])
			more := len(t.waiting) > 0
			t.mu.Unlock()
			for _, ch := range round {
				close(ch)
			}
			if !more {
				// A command that arrives from now on kicks.
				break
			}
		}
	}
}

// nextLocked removes from waiting, and appends to round, the channel of
// each group's ticket with the lowest order (the first to arrive among
// equal ones). Call with t.mu held.
func (t *turnstile) nextLocked(round []chan struct{}) []chan struct{} {
	if len(t.waiting) == 0 {
		return round
	}
	// Stable by (group, order): arrival order breaks ties.
	slices.SortStableFunc(t.waiting, func(a, b ticket) int {
		if a.group != b.group {
			if a.group < b.group {
				return -1
			}
			return 1
		}
		switch {
		case a.order < b.order:
			return -1
		case a.order > b.order:
			return 1
		}
		return 0
	})
	var prev uint64
	kept := t.waiting[:0]
	for i, tk := range t.waiting {
		if i == 0 || tk.group != prev {
			prev = tk.group
			round = append(round, tk.ch)
			continue
		}
		kept = append(kept, tk)
	}
	clear(t.waiting[len(kept):])
	t.waiting = kept
	return round
}

// close lets every waiting command through, and every later one at once,
// and stops the loop.
func (t *turnstile) close() {
	t.mu.Lock()
	t.closed = true
	for _, tk := range t.waiting {
		close(tk.ch)
	}
	t.waiting = nil
	t.mu.Unlock()
	close(t.stop)
	<-t.done
}
