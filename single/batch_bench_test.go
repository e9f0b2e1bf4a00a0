package single_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/single"
)

// BenchmarkExtendBatch measures one ExtendBatch over many keys, on one
// node and on a three-master Cluster (keys spread over the slots, and keys
// sharing one hash tag), reported per key.
func BenchmarkExtendBatch(b *testing.B) {
	one := redistest.Start(b, redistest.Config{}).Client()
	cc := redistest.ClusterClient(b, redistest.StartCluster(b, 3))
	for _, bc := range []struct {
		name   string
		client redis.UniversalClient
		key    string
	}{
		{"node=1/locks=1000", one, "bench:%d"},
		{"cluster=3/locks=1000", cc, "bench:%d"},
		{"cluster=3/locks=1000/slots=1", cc, "{bench}:%d"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ctx := context.Background()
			items := make([]redlease.Extension, 1000)
			for i := range items {
				items[i] = redlease.Extension{Key: fmt.Sprintf(bc.key, i), Token: "tok", TTL: time.Minute}
				if err := bc.client.Set(ctx, items[i].Key, "tok", time.Minute).Err(); err != nil {
					b.Fatal(err)
				}
			}
			s, err := single.New(bc.client)
			require.NoError(b, err)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				for i, r := range s.ExtendBatch(ctx, items) {
					if r.Err != nil {
						b.Fatalf("item %d: %v", i, r.Err)
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(items)), "ns/lock")
		})
	}
}
