package redlease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/single"
)

// With no option, Do keeps its lock alive with the process-wide default
// watchdog for as long as the function runs, however long that is, and the
// watchdog's goroutines end once no Do is running.
func ExampleLocker_Do_default() {
	ctx := context.Background()
	m, err := miniredis.Run() // in-process stand-in for a Redis primary
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()

	s, err := single.New(client)
	if err != nil {
		panic(err)
	}
	locker, err := redlease.New(s)
	if err != nil {
		panic(err)
	}
	err = locker.Do(ctx, "report:2026-11", func(ctx context.Context, lk *redlease.Lock) error {
		// Renewed every third of the TTL while this runs; ctx is
		// cancelled if a renewal finds the lock lost.
		fmt.Println("building the report with a fence:", lk.Fence() > 0)
		return nil
	})
	fmt.Println("done:", err)
	// Output:
	// building the report with a fence: true
	// done: <nil>
}

// WithoutKeeper turns renewal off for work that must fit in one TTL: fn's
// ctx is cancelled at the loss margin, a tenth of the TTL before the lock
// expires.
func ExampleWithoutKeeper() {
	ctx := context.Background()
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()

	s, err := single.New(client)
	if err != nil {
		panic(err)
	}
	locker, err := redlease.New(s, redlease.WithTTL(5*time.Second))
	if err != nil {
		panic(err)
	}
	err = locker.Do(ctx, "dedup:msg-42", func(ctx context.Context, lk *redlease.Lock) error {
		// Nothing renews the lock: finish within 4.5 s (TTL less the
		// loss margin), when ctx is cancelled.
		fmt.Println("deduplicating with a fence:", lk.Fence() > 0)
		return nil
	}, redlease.WithoutKeeper())
	fmt.Println("done:", err)
	// Output:
	// deduplicating with a fence: true
	// done: <nil>
}
