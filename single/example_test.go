package single_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/single"
)

// One primary, fences on by default. Pass the fence to the storage you
// write to, so a holder that lost the lock without noticing is refused.
func Example() {
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
	locker, err := redlease.New(s, redlease.WithTTL(30*time.Second))
	if err != nil {
		panic(err)
	}
	lk, err := locker.Lock(ctx, "invoice:42")
	if err != nil {
		panic(err)
	}
	defer lk.Release(ctx)

	// A fence counter created anew starts from the server's clock (in
	// microseconds since the epoch); each grant after that adds one.
	fmt.Println("fenced:", lk.Fence() > 0)
	fmt.Println("valid:", lk.Valid())
	// Output:
	// fenced: true
	// valid: true
}

// Locks with different needs on one Locker: single by default, quorum (or
// any other Strategy) for the operations that move money.
func Example_perOperationStrategy() {
	ctx := context.Background()
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()

	cheap, err := single.New(client, single.WithoutFencing())
	if err != nil {
		panic(err)
	}
	fenced, err := single.New(client)
	if err != nil {
		panic(err)
	}
	locker, err := redlease.New(cheap, redlease.WithPrefix("lock:"))
	if err != nil {
		panic(err)
	}

	dedup, err := locker.TryLock(ctx, "email:welcome:7", redlease.WithTTL(time.Minute))
	if err != nil {
		panic(err)
	}
	defer dedup.Release(ctx)
	money, err := locker.TryLock(ctx, "payout:7", redlease.WithStrategy(fenced))
	if err != nil {
		panic(err)
	}
	defer money.Release(ctx)
	fmt.Println(dedup.Fence(), money.Fence() > 0)
	// Output: 0 true
}
