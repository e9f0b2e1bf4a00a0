package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/script"
)

// maxCommandLen bounds the command line stored in the metadata.
const maxCommandLen = 4096

// holderKey is the metadata key beside the lock key fullKey, in the same
// Cluster slot (as the library's fence keys are), where the library's
// Inspect reads it (redlease.HolderRecord).
func holderKey(fullKey string) string { return script.HolderKey(fullKey) }

// holder is who holds a lock: what run stores beside the grant.
type holder struct {
	Token   string `json:"token"`
	Host    string `json:"host"`
	PID     int    `json:"pid"`
	Start   string `json:"start"` // RFC 3339, UTC
	Command string `json:"command"`
	Fence   uint64 `json:"fence,omitempty"`
}

// writeHolder stores the metadata only while the lock key holds the token,
// with the lock key's remaining TTL, so it never outlives the grant.
var writeHolder = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then return 0 end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'token', ARGV[1], 'host', ARGV[2], 'pid', ARGV[3], 'start', ARGV[4], 'command', ARGV[5], 'fence', ARGV[6])
redis.call('PEXPIRE', KEYS[2], ttl)
return 1`)

// deleteHolder deletes the metadata if it is this holder's. Both scripts,
// and inspect, use only commands docs/redis-acl.conf grants (HMGET, not
// HGET or HGETALL).
var deleteHolder = redis.NewScript(`
if redis.call('HMGET', KEYS[1], 'token')[1] == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

// holderKeeper writes a lock's metadata on every node and refreshes it
// every third of the TTL until stop, which deletes it.
type holderKeeper struct {
	clients []redis.UniversalClient
	keys    []string
	args    []any
	every   time.Duration
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

func keepHolder(clients []redis.UniversalClient, fullKey string, lk *redlease.Lock, command []string) *holderKeeper {
	host, _ := os.Hostname()
	cmdline := strings.Join(command, " ")
	if len(cmdline) > maxCommandLen {
		cmdline = cmdline[:maxCommandLen]
	}
	h := &holderKeeper{
		clients: clients,
		keys:    []string{fullKey, holderKey(fullKey)},
		args: []any{lk.Token(), host, strconv.Itoa(os.Getpid()), time.Now().UTC().Format(time.RFC3339Nano),
			cmdline, strconv.FormatUint(lk.Fence(), 10)},
		every: max(lk.TTL()/3, 10*time.Millisecond),
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	missing := h.write(ctx)
	// A node's copy of the lock may land after the grant (a majority
	// answered first): while a node lacks the metadata, it is asked again
	// after holderRetry, then after twice as long each time, up to a third
	// of the TTL. A copy that lands a time L after the first write is
	// found within L plus holderRetry of landing, however late it lands.
	h.wg.Go(func() {
		retry := holderRetry
		for {
			d := h.every
			if missing > 0 {
				d = min(d, retry)
				retry = min(2*retry, h.every)
			} else {
				retry = holderRetry
			}
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
				missing = h.write(ctx)
			}
		}
	})
	return h
}

// holderRetry is how soon a node that lacked the metadata is asked again
// (the first time; the wait doubles from there).
const holderRetry = 50 * time.Millisecond

// write refreshes the metadata on every node at once, each within a third
// of the TTL (a second at most), and returns on how many nodes it is
// missing (the key not ours there yet, or a failure): left to the next
// round.
func (h *holderKeeper) write(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, min(h.every, time.Second))
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	missing := 0
	for _, c := range h.clients {
		wg.Go(func() {
			n, err := writeHolder.Run(ctx, c, h.keys, h.args...).Int64()
			if err != nil || n != 1 {
				mu.Lock()
				missing++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return missing
}

// stop ends the refreshing and deletes the metadata (best effort, within
// timeout).
func (h *holderKeeper) stop(timeout time.Duration) {
	h.cancel()
	h.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, c := range h.clients {
		wg.Go(func() { _ = deleteHolder.Run(ctx, c, h.keys[1:], h.args[0]).Err() })
	}
	wg.Wait()
}
