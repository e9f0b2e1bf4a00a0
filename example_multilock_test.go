package redlease_test

import (
	"context"
	"fmt"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/single"
)

// A transfer holds both accounts at once. DoAll takes them in one order
// every caller shares, so a transfer the other way round waits instead of
// deadlocking; each account has its own fence for its own storage.
func ExampleLocker_DoAll() {
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
	transfer := func(from, to string) error {
		return locker.DoAll(ctx, []string{"acct:" + from, "acct:" + to}, func(ctx context.Context, set *redlease.LockSet) error {
			// Debit from and credit to, each write carrying its key's
			// fence; ctx ends if either lock is lost.
			fmt.Println("taken in order:", set.Keys(), "fenced:", set.Fence("acct:"+from) > 0 && set.Fence("acct:"+to) > 0)
			return nil
		})
	}
	fmt.Println(transfer("alice", "bob"))
	fmt.Println(transfer("bob", "alice"))
	// Output:
	// taken in order: [acct:alice acct:bob] fenced: true
	// <nil>
	// taken in order: [acct:alice acct:bob] fenced: true
	// <nil>
}
