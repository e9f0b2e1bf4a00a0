package single_test

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/redlease/redlease/internal/contract"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/single"
)

func TestMain(m *testing.M) {
	redistest.QuietClientLogs()
	goleak.VerifyTestMain(m)
}

func TestContract(t *testing.T) {
	c := redistest.Start(t, redistest.Config{}).Client()
	contract.Run(t, func(t *testing.T) contract.Setup {
		strategy, err := single.New(c)
		require.NoError(t, err)
		return contract.Setup{Strategy: strategy, Nodes: []redis.UniversalClient{c}, Quorum: 1, Fencing: true}
	})
}

func TestContractWithoutFencing(t *testing.T) {
	c := redistest.Start(t, redistest.Config{}).Client()
	contract.Run(t, func(t *testing.T) contract.Setup {
		strategy, err := single.New(c, single.WithoutFencing())
		require.NoError(t, err)
		return contract.Setup{Strategy: strategy, Nodes: []redis.UniversalClient{c}, Quorum: 1}
	})
}

// A cluster-mode server refuses scripts whose keys span slots (CROSSSLOT),
// so this shows the lock key and its fence counter always share a slot.
func TestContractOnCluster(t *testing.T) {
	srv := redistest.Start(t, redistest.Config{Cluster: true})
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{srv.Addr}})
	t.Cleanup(func() { _ = c.Close() })
	contract.Run(t, func(t *testing.T) contract.Setup {
		strategy, err := single.New(c)
		require.NoError(t, err)
		return contract.Setup{Strategy: strategy, Nodes: []redis.UniversalClient{c}, Quorum: 1, Fencing: true}
	})
}
