package redlease_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/single"
)

// At most two calls to a partner's API at once, across every replica:
// each permit is the lock of one slot, with that slot's fence.
func ExampleSemaphore() {
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
	api, err := locker.Semaphore("partner:api", 2)
	if err != nil {
		panic(err)
	}
	a, err := api.TryAcquire(ctx)
	if err != nil {
		panic(err)
	}
	b, err := api.TryAcquire(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("two permits on two slots:", a.Key() != b.Key(), "fenced:", a.Fence() > 0 && b.Fence() > 0)
	_, err = api.TryAcquire(ctx)
	fmt.Println("a third:", errors.Is(err, redlease.ErrNotObtained))
	_ = a.Release(ctx)
	err = api.Do(ctx, func(ctx context.Context, permit *redlease.Lock) error {
		fmt.Println("after a release, the freed slot:", permit.Key() == a.Key())
		return nil
	})
	fmt.Println(err)
	_ = b.Release(ctx)
	// Output:
	// two permits on two slots: true fenced: true
	// a third: true
	// after a release, the freed slot: true
	// <nil>
}
