package sim

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
)

// TestKeySlot checks the simulator's CRC16 against Redis Cluster's
// specification: CRC16("123456789") is 0x31C3, and keys with one hash tag
// share its slot.
func TestKeySlot(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want int
	}{
		{"123456789", 0x31c3},
		{"{123456789}.x", 0x31c3},
		{"a{}b", keySlot("a{}b")},
		{"{user1000}.following", keySlot("user1000")},
	} {
		if got := keySlot(tc.key); got != tc.want {
			t.Errorf("keySlot(%q) = %d, want %d", tc.key, got, tc.want)
		}
	}
	for m, k := range clusterKeys {
		if got := masterOfSlot(keySlot(k)); got != m {
			t.Errorf("cluster key %q: master %d, want %d", k, got, m)
		}
	}
}

// TestClusterRefusesOtherMastersKeys: a Cluster node answers a key of
// another master's slot with MOVED and applies nothing, a script touching
// an undeclared key of another master's slot fails ("non local key"), one
// touching an undeclared key of another slot of its own node succeeds, and
// a go-redis ClusterClient
// learns the topology and reaches every key.
func TestClusterRefusesOtherMastersKeys(t *testing.T) {
	sc, _ := ScenarioByName("watchdog-mixed")
	sc.Faults = false
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		w := newWorld(sc, 1, Options{})
		defer func() {
			for _, c := range w.clients {
				_ = c.Close()
			}
			for _, n := range w.nodes {
				n.close()
			}
			w.net.close()
		}()
		ms := w.clusterNodes()
		k0, k1 := clusterKeys[0], clusterKeys[1]
		wrong := w.redisClient(0, ms[1], true)
		err := wrong.Set(ctx, k0, "v", 0).Err()
		if err == nil || !strings.HasPrefix(err.Error(), "MOVED ") || !strings.HasSuffix(err.Error(), " "+ms[0].addr) {
			t.Fatalf("SET %s on %s: %v, want MOVED to %s", k0, ms[1].name, err, ms[0].addr)
		}
		if got := ms[1].get(k0); got != "" {
			t.Fatalf("the refused SET was applied on %s: %q", ms[1].name, got)
		}
		if err := wrong.Set(ctx, k1, "v", 0).Err(); err != nil {
			t.Fatalf("SET %s on its own master: %v", k1, err)
		}
		err = wrong.Eval(ctx, "return redis.call('SET', KEYS[1] .. '', ARGV[1]) and redis.call('SET', ARGV[2], 'x')", []string{k1}, "v", k0).Err()
		if err == nil || !strings.Contains(err.Error(), "non local key") && !strings.Contains(err.Error(), "same slot") {
			t.Fatalf("script touching %s on %s: %v, want a non-local-key error", k0, ms[1].name, err)
		}
		// An undeclared key of another slot that the node serves: allowed
		// (Redis 7.0, a script without a shebang).
		local := ""
		for i := 0; local == "" && i < 1000; i++ {
			if k := fmt.Sprintf("local%d", i); w.master(k) == ms[1] && keySlot(k) != keySlot(k1) {
				local = k
			}
		}
		if local == "" {
			t.Fatalf("no key of another slot on %s among 1000", ms[1].name)
		}
		if err := wrong.Eval(ctx, "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('SET', ARGV[2], 'x')", []string{k1}, "v", local).Err(); err != nil {
			t.Fatalf("script touching %s (slot %d) declaring %s (slot %d), both on %s: %v", local, keySlot(local), k1, keySlot(k1), ms[1].name, err)
		}
		if got := ms[1].get(local); got != "x" {
			t.Fatalf("the script's undeclared write on %s: %q", ms[1].name, got)
		}
		if err := wrong.Del(ctx, k0, k1).Err(); err == nil || !strings.HasPrefix(err.Error(), "CROSSSLOT") {
			t.Fatalf("DEL %s %s: %v, want CROSSSLOT", k0, k1, err)
		}
		cc := w.clusterClient(0, true)
		for _, k := range clusterKeys {
			if err := cc.Set(ctx, k, "via-cluster", 0).Err(); err != nil {
				t.Fatalf("ClusterClient SET %s: %v", k, err)
			}
			if got := w.master(k).get(k); got != "via-cluster" {
				t.Fatalf("%s on its master %s: %q", k, w.master(k).name, got)
			}
		}
		if w.moved != 2 {
			t.Fatalf("%d commands refused as another master's, want 2 (the SET and the script's)", w.moved)
		}
	})
}
