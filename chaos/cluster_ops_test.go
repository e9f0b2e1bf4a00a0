package chaos

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease/internal/redistest"
)

// lockSlot is the slot of the lock key of k (the scenarios' prefix
// "chaos:"); its fence counter shares it.
func lockSlot(k string) int { return slotOf("chaos:" + k) }

// slotOf is Redis Cluster's hash slot of key: CRC16 (XMODEM) of its hash
// tag, or of the whole key, mod 16384.
func slotOf(key string) int {
	if open := strings.IndexByte(key, '{'); open >= 0 {
		if end := strings.IndexByte(key[open+1:], '}'); end > 0 {
			key = key[open+1 : open+1+end]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) & 16383
}

// migrateSlot moves slot from src to dst as redis-cli --cluster reshard
// does: CLUSTER SETSLOT IMPORTING on dst, MIGRATING on src, then the
// slot's keys in batches of batch (CLUSTER GETKEYSINSLOT, MIGRATE … KEYS)
// until none is left, calling pause with each batch's keys after it moved,
// then CLUSTER SETSLOT NODE dst on dst, src and every other master. At
// most 10,000 batches.
func migrateSlot(ctx context.Context, masters []*redistest.Server, src, dst *redistest.Server, slot, batch int, pause func(keys []string)) error {
	sc, dc := redis.NewClient(&redis.Options{Addr: src.Addr}), redis.NewClient(&redis.Options{Addr: dst.Addr})
	defer sc.Close()
	defer dc.Close()
	srcID, err := sc.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		return fmt.Errorf("CLUSTER MYID on %s: %w", src.Addr, err)
	}
	dstID, err := dc.Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		return fmt.Errorf("CLUSTER MYID on %s: %w", dst.Addr, err)
	}
	if err := dc.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err(); err != nil {
		return fmt.Errorf("SETSLOT %d IMPORTING on %s: %w", slot, dst.Addr, err)
	}
	if err := sc.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err(); err != nil {
		return fmt.Errorf("SETSLOT %d MIGRATING on %s: %w", slot, src.Addr, err)
	}
	for range 10_000 {
		keys, err := sc.ClusterGetKeysInSlot(ctx, slot, batch).Result()
		if err != nil {
			return fmt.Errorf("GETKEYSINSLOT %d on %s: %w", slot, src.Addr, err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", "127.0.0.1", dst.Port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := sc.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("MIGRATE %v to %s: %w", keys, dst.Addr, err)
		}
		pause(keys)
	}
	order := []*redistest.Server{dst, src}
	for _, m := range masters {
		if m != dst && m != src {
			order = append(order, m)
		}
	}
	for _, m := range order {
		c := redis.NewClient(&redis.Options{Addr: m.Addr})
		err := c.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err()
		_ = c.Close()
		if err != nil {
			return fmt.Errorf("SETSLOT %d NODE on %s: %w", slot, m.Addr, err)
		}
	}
	return nil
}

// commandCalls is how many times s served command (INFO commandstats'
// cmdstat_<command>), 0 if never.
func commandCalls(ctx context.Context, t *testing.T, s *redistest.Server, command string) int64 {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	info, err := c.Info(ctx, "commandstats").Result()
	require.NoError(t, err)
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+command+":calls="); ok {
			calls, _, _ := strings.Cut(rest, ",")
			v, err := strconv.ParseInt(calls, 10, 64)
			require.NoError(t, err, "%q", line)
			return v
		}
	}
	return 0
}

// clusterInfoField is field of CLUSTER INFO on s, "" when s does not
// answer.
func clusterInfoField(ctx context.Context, s *redistest.Server, field string) string {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond})
	defer c.Close()
	info, err := c.ClusterInfo(ctx).Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return v
		}
	}
	return ""
}

// flagsOf is the flags field of the node at addr in CLUSTER NODES on s,
// "" when s does not answer or does not list it.
func flagsOf(ctx context.Context, s *redistest.Server, addr string) string {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ReadTimeout: 500 * time.Millisecond})
	defer c.Close()
	nodes, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(nodes, "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && strings.HasPrefix(f[1], addr+"@") {
			return f[2]
		}
	}
	return ""
}
