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

// An operator looks at a stuck lock and revokes it: Inspect says who
// holds it, ForceRelease deletes exactly the token Inspect showed, so a
// key that changed hands in between is left alone (ErrNotHeld). The
// revoked holder learns at its next renewal (its Lost closes); until then
// only fences keep its late writes out of storage.
func ExampleLocker_ForceRelease() {
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
	stuck, err := locker.TryLock(ctx, "settle:2026-12-04") // a holder that hangs
	if err != nil {
		panic(err)
	}

	in, err := locker.Inspect(ctx, "settle:2026-12-04")
	if err != nil {
		panic(err) // ErrUnavailable: too few nodes answered; never "held"
	}
	fmt.Println("state:", in.State, "| the stuck holder:", in.Token == stuck.Token(), "| fence:", in.Fence == stuck.Fence())
	fmt.Println("since known:", !in.Since.IsZero(), "| waiters:", in.Waiters)

	r, err := locker.ForceRelease(ctx, "settle:2026-12-04", in.Token)
	switch {
	case errors.Is(err, redlease.ErrNotHeld):
		fmt.Println("changed hands since the inspection: nothing deleted")
	case err != nil:
		panic(err)
	default:
		fmt.Println("revoked on", r.Deleted, "of", len(r.Nodes), "node(s)")
	}
	fmt.Println("the holder's next renewal:", stuck.Extend(ctx, stuck.TTL()))
	_, err = locker.ForceRelease(ctx, "settle:2026-12-04", in.Token)
	fmt.Println("again:", errors.Is(err, redlease.ErrNotHeld))
	// Output:
	// state: held | the stuck holder: true | fence: true
	// since known: false | waiters: 0
	// revoked on 1 of 1 node(s)
	// the holder's next renewal: redlease: lock not held
	// again: true
}
