package quorum_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/quorum"
)

// Five independent nodes (in-process here; real primaries in production),
// a majority of three per grant, fences on.
func Example() {
	ctx := context.Background()
	var nodes []redis.UniversalClient
	for range 5 {
		m, err := miniredis.Run() // in-process stand-in for one Redis primary
		if err != nil {
			panic(err)
		}
		defer m.Close()
		c := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
		defer c.Close()
		nodes = append(nodes, c)
	}
	// A node timeout of a second: in production it bounds how long a slow
	// node may hold a call (default 100 ms); here the in-process nodes
	// share the CPU with everything else the test binary runs.
	s, err := quorum.New(nodes, quorum.WithFencing(), quorum.WithNodeTimeout(time.Second))
	if err != nil {
		panic(err)
	}
	defer s.Close()
	locker, err := redlease.New(s, redlease.WithTTL(10*time.Second))
	if err != nil {
		panic(err)
	}

	wait, cancel := context.WithTimeout(ctx, 10*time.Second) // Lock waits as long as ctx allows
	defer cancel()
	lk, err := locker.Lock(wait, "settle:2026-11-29")
	if err != nil {
		panic(err)
	}
	// Every attempt draws a fence from a majority, so the first holder's
	// fence is 1 unless an attempt failed before (a slow node): print what
	// does not depend on that.
	fmt.Println("holding with a fence:", lk.Fence() > 0)

	// A second contender cannot get in while the lock is held.
	_, err = locker.TryLock(ctx, "settle:2026-11-29")
	fmt.Println("second contender obtained:", !errors.Is(err, redlease.ErrNotObtained))

	if err := lk.Release(ctx); err != nil {
		panic(err)
	}
	next, err := locker.Lock(wait, "settle:2026-11-29")
	if err != nil {
		panic(err)
	}
	defer next.Release(ctx)
	fmt.Println("next holder's fence is higher:", next.Fence() > lk.Fence())
	// Output:
	// holding with a fence: true
	// second contender obtained: false
	// next holder's fence is higher: true
}
