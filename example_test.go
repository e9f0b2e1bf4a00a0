package redlease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/renew"
	"github.com/redlease/redlease/single"
)

// Do runs a function under a lock that a shared watchdog keeps alive, and
// releases the lock only after the function returned, so what it committed
// is visible before the next holder gets in. Pass the fence to the storage.
func ExampleLocker_Do() {
	ctx := context.Background()
	m, err := miniredis.Run() // in-process stand-in for a Redis primary
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()

	watchdog, err := renew.New() // one per process
	if err != nil {
		panic(err)
	}
	defer watchdog.Close()
	s, err := single.New(client)
	if err != nil {
		panic(err)
	}
	locker, err := redlease.New(s, redlease.WithTTL(30*time.Second), redlease.WithKeeper(watchdog))
	if err != nil {
		panic(err)
	}

	err = locker.Do(ctx, "settle:2026-11-29", func(ctx context.Context, lk *redlease.Lock) error {
		// ctx is cancelled if the lock is lost; stop and do not commit then.
		fmt.Println("settling with a fence:", lk.Fence() > 0)
		return nil // e.g. UPDATE … SET fence = ? WHERE fence < ?
	})
	fmt.Println("done:", err)
	// Output:
	// settling with a fence: true
	// done: <nil>
}
