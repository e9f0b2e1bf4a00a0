package sim

import (
	"context"
	"math"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// orderHook spreads the commands a go-redis client starts at one virtual
// instant without an idle pooled connection over distinct instants in an
// order of the seed: such a command waits 1-4096 ns (maxSettle), drawn
// from the seed, its client, its target and its content, before it asks
// the client's pool for a connection. (A command that finds an idle
// connection goes at once: waiting on every command cost the rotation
// about a sixth of its CPU. Two commands leaving together with one idle
// connection between them still take it in the Go scheduler's order.) Without it, goroutines woken together (the library's
// fan-out workers when one ctx ends, an Extend and a renewal of one lock)
// take the pool's idle connections, or queue for new ones, in the Go
// scheduler's order; go-redis hands a dial's connection to the request at
// the front of its queue, so which request went out on which connection,
// and when, followed the scheduler. Commands of one content wait the
// same time, so repeated renewals of one lock keep their spacing.
type orderHook struct {
	key  uint64     // mix(seed, client, target)
	idle func() int // the client's idle pooled connections (nil: unknown)
}

// orderHookFor is the orderHook of client ci's go-redis client to target.
func (w *World) orderHookFor(ci int, target uint64, idle func() int) orderHook {
	return orderHook{key: mix(mix(w.seed, 0x07de7), uint64(ci+2)<<32|target), idle: idle}
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
		h.wait(ctx, k)
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
		h.wait(ctx, k)
		err := next(ctx, cmds)
		h.settle(ctx, live, err, k)
		return err
	}
}

// wait sleeps the command's delay, or until ctx ends.
func (h orderHook) wait(ctx context.Context, content uint64) {
	if h.idle != nil && h.idle() > 0 {
		return
	}
	d := time.Duration(1 + mix(h.key, content)%maxSettle)
	t := time.NewTimer(d)
	select {
	case <-t.C:
	case <-ctx.Done():
		t.Stop()
	}
}

// settle, when ctx ended while the command ran (live: its ctx had not
// ended when it started), sleeps 1-4096 ns more drawn like wait's, so
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
