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

// One replica leads; its term is its lock's fence, which storage compares
// so that a deposed leader's writes are refused.
func ExampleElection_Campaign() {
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
	election, err := redlease.NewElection(locker, "settlement:nightly")
	if err != nil {
		panic(err)
	}
	lead, err := election.Campaign(ctx, "replica-7")
	if err != nil {
		panic(err)
	}
	leader, err := election.Leader(ctx)
	fmt.Println(leader.Value, leader.Term == lead.Term(), err)
	fmt.Println(lead.Proclaim(ctx, "replica-7 (batch 2 of 3)"))
	leader, _ = election.Leader(ctx)
	fmt.Println(leader.Value)
	fmt.Println(lead.Resign(ctx))
	_, err = election.Leader(ctx)
	fmt.Println(errors.Is(err, redlease.ErrNoLeader))
	// Output:
	// replica-7 true <nil>
	// <nil>
	// replica-7 (batch 2 of 3)
	// <nil>
	// true
}
