package failover_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/failover"
)

// A grant needs a replica's acknowledgement. The in-process server here has
// no replica, so WAIT answers 0 and the lock is refused rather than granted
// on the primary alone. In production, pass a client from
// redis.NewFailoverClient and run a Watcher (see NewWatcher) on the Sentinels.
func Example() {
	ctx := context.Background()
	m, err := miniredis.Run()
	if err != nil {
		panic(err)
	}
	defer m.Close()
	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()

	s, err := failover.New(client, failover.WithReplicas(1), failover.WithWaitTimeout(50*time.Millisecond))
	if err != nil {
		panic(err)
	}
	locker, err := redlease.New(s)
	if err != nil {
		panic(err)
	}
	_, err = locker.TryLock(ctx, "payout:7")
	fmt.Println("obtained:", err == nil)
	fmt.Println("not replicated:", errors.Is(err, failover.ErrNotReplicated))
	exists, _ := client.Exists(ctx, "payout:7").Result()
	fmt.Println("keys left behind:", exists)
	// Output:
	// obtained: false
	// not replicated: true
	// keys left behind: 0
}

// On a Redis Cluster, every grant and renewal waits for all the replicas
// of the key's shard (as CLUSTER SHARDS lists them), so a failover cannot
// promote a replica that lacks the lock. The addresses are placeholders:
// this example is compiled, not run.
func ExampleNew_cluster() {
	ctx := context.Background()
	cc := redis.NewClusterClient(&redis.ClusterOptions{
		Addrs: []string{"127.0.0.1:7000", "127.0.0.1:7001", "127.0.0.1:7002"},
	})
	defer cc.Close()
	s, err := failover.New(cc, failover.WithWaitTimeout(100*time.Millisecond))
	if err != nil {
		panic(err)
	}
	locker, err := redlease.New(s, redlease.WithTTL(10*time.Second))
	if err != nil {
		panic(err)
	}
	err = locker.Do(ctx, "settlement:2026-12-03", func(ctx context.Context, lk *redlease.Lock) error {
		fmt.Println("fence", lk.Fence()) // storage refuses writes below it
		return nil
	})
	if errors.Is(err, failover.ErrNotReplicated) {
		fmt.Println("a replica of the shard is down or behind: try later")
	}
}
