// Command turns shows contenders taking turns on one quorum lock, with
// fences checked by the resource they protect.
//
// By default it runs five in-process Redis nodes (miniredis), so it needs
// no servers:
//
//	go -C examples run ./turns
//
// Point it at real, independent Redis primaries with -nodes:
//
//	go -C examples run ./turns -nodes 127.0.0.1:6379,127.0.0.1:6380,127.0.0.1:6381
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/quorum"
)

func main() {
	nodesFlag := flag.String("nodes", "", "comma-separated addresses of independent Redis primaries (default: 5 in-process nodes)")
	workers := flag.Int("workers", 4, "contenders")
	turns := flag.Int("turns", 3, "turns each contender takes")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *nodesFlag, *workers, *turns); err != nil {
		fmt.Fprintln(os.Stderr, "turns:", err)
		os.Exit(1)
	}
}

// register is the protected resource: it accepts a write only with a fence
// above the last one it accepted, as a database row with a fence column
// would (UPDATE … WHERE fence < ?).
type register struct {
	mu       sync.Mutex
	fence    uint64
	writes   int
	rejected int
}

func (r *register) write(fence uint64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if fence <= r.fence {
		r.rejected++
		return false
	}
	r.fence = fence
	r.writes++
	return true
}

func run(ctx context.Context, nodeList string, workers, turns int) error {
	clients, cleanup, where, err := connect(nodeList)
	if err != nil {
		return err
	}
	defer cleanup()
	s, err := quorum.New(clients, quorum.WithFencing(), quorum.WithNodeTimeout(200*time.Millisecond))
	if err != nil {
		return err
	}
	defer s.Close()
	locker, err := redlease.New(s, redlease.WithTTL(5*time.Second), redlease.WithPrefix("redlease-demo:"))
	if err != nil {
		return err
	}
	fmt.Printf("%d contenders, %d turns each, one quorum lock on %s (majority %d)\n\n", workers, turns, where, s.Quorum())

	var (
		reg      register
		printMu  sync.Mutex
		wg       sync.WaitGroup
		failures = make(chan error, workers)
	)
	start := time.Now()
	for w := 1; w <= workers; w++ {
		wg.Go(func() {
			for range turns {
				lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				lk, err := locker.Lock(lctx, "turns")
				cancel()
				if err != nil {
					failures <- fmt.Errorf("worker %d: %w", w, err)
					return
				}
				ok := reg.write(lk.Fence())
				printMu.Lock()
				fmt.Printf("%7.1fms  worker %d holds the lock  fence %-3d valid for %-6s write accepted: %v\n",
					float64(time.Since(start).Microseconds())/1000, w, lk.Fence(),
					time.Until(lk.Until()).Round(time.Millisecond), ok)
				printMu.Unlock()
				time.Sleep(10 * time.Millisecond) // the work
				if err := lk.Release(ctx); err != nil {
					failures <- fmt.Errorf("worker %d release: %w", w, err)
					return
				}
				// A holder that "wakes up late" and writes again with its old
				// fence: the register must refuse it.
				if reg.write(lk.Fence()) {
					failures <- fmt.Errorf("worker %d: a stale write with fence %d was accepted", w, lk.Fence())
					return
				}
			}
		})
	}
	wg.Wait()
	close(failures)
	var errs []error
	for err := range failures {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	want := workers * turns
	fmt.Printf("\n%d turns, fences rising to %d, %d late writes with an old fence rejected\n", reg.writes, reg.fence, reg.rejected)
	if reg.writes != want || reg.rejected != want {
		return fmt.Errorf("expected %d accepted and %d rejected writes", want, want)
	}
	fmt.Println("every holder had a higher fence than the one before: verified")
	return nil
}

// connect returns clients for the given addresses, or for five in-process
// nodes when none are given.
func connect(list string) ([]redis.UniversalClient, func(), string, error) {
	var (
		clients []redis.UniversalClient
		closers []func()
	)
	cleanup := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	addrs := strings.Split(list, ",")
	where := list
	if list == "" {
		addrs = nil
		for range 5 {
			m, err := miniredis.Run()
			if err != nil {
				cleanup()
				return nil, nil, "", err
			}
			closers = append(closers, m.Close)
			addrs = append(addrs, m.Addr())
		}
		where = "5 in-process nodes"
	}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: strings.TrimSpace(a), ContextTimeoutEnabled: true})
		closers = append(closers, func() { _ = c.Close() })
		clients = append(clients, c)
	}
	return clients, cleanup, where, nil
}
