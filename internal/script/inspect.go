package script

import (
	"strings"

	"github.com/redlease/redlease"
)

// Inspect reads, in one atomic step and writing nothing, what a node holds
// for a lock key: the key's value and remaining TTL, its fence counter,
// the live entries of its fair-mode line (those whose deadline has not
// passed by the node's TIME: the Acquire script purges the others), and
// the holder record beside it (HolderKey). The line and the record are
// read under redis.pcall: a user whose ACL lacks their commands still
// reads the lock (the line then counts 0, the record is empty).
//
//	KEYS[1] lock key, KEYS[2] fence counter key, KEYS[3] the line
//	(QueueKey), KEYS[4] the holder record (HolderKey)
//	reply: {held (1 or 0), value ("" when not held), PTTL in ms (0 when
//	not held), fence counter ("" when none), live waiters, and the
//	record's token, host, pid, start, command and fence ("" each when
//	absent)}
var Inspect = newScript(4, `
local v = redis.call('GET', KEYS[1])
local held, pttl = 0, 0
if v then
  held = 1
  pttl = redis.call('PTTL', KEYS[1])
else
  v = ''
end
local f = redis.call('GET', KEYS[2]) or ''
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local waiters = 0
local live = redis.pcall('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. string.format('%d', -now))
if type(live) == 'table' and live.err == nil then
  waiters = #live
end
local out = {held, v, pttl, f, waiters, '', '', '', '', '', ''}
local h = redis.pcall('HMGET', KEYS[4], 'token', 'host', 'pid', 'start', 'command', 'fence')
if type(h) == 'table' and h.err == nil then
  for i = 1, 6 do
    if h[i] then
      out[5 + i] = h[i]
    end
  end
end
return out
`)

// InspectArgs returns the Inspect command line of key, which must pass
// CheckKey.
func InspectArgs(key string) []any {
	return Inspect.Args(key, MustFenceKey(key), QueueKey(key), HolderKey(key))
}

// HolderKey returns the key of the holder record beside a lock key (see
// redlease.HolderRecord), built like FenceKey, in the key's cluster slot
// and the reserved namespace: "redlease:holder:tag:"+key for a key with a
// hash tag, "redlease:holder:{"+key+"}" otherwise. `redlease run` writes
// it; Inspect reads it.
func HolderKey(key string) string {
	if hasHashTag(key) {
		return holderPrefix + "tag:" + key
	}
	return holderPrefix + "{" + key + "}"
}

// holderPrefix starts every holder record's key.
const holderPrefix = redlease.ReservedPrefix + "holder:"

// CheckKey validates a key that is read or force-released rather than
// acquired (redlease.ErrInvalid): the key checks of Check.
func CheckKey(key string) error {
	switch {
	case key == "":
		return redlease.Invalid("empty key")
	case !hasHashTag(key) && strings.IndexByte(key, '}') >= 0:
		return redlease.Invalid("key %q: contains '}' without a hash tag, so no lock can have it", key)
	case strings.HasPrefix(key, redlease.ReservedPrefix):
		return redlease.Invalid("key %q: keys starting with %q are redlease's own (fence counters, boot markers)", key, redlease.ReservedPrefix)
	}
	return nil
}
