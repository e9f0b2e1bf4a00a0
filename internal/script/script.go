// Package script holds the Lua scripts and key layout shared by the
// strategies. Every script compares the caller's token before it touches a
// lock key, and each runs atomically on one Redis node: no GET-then-SET race
// exists between a check and its action. No script shortens a lock key
// that holds the caller's token: an extension or a refresh raises its TTL
// to the one asked, or leaves a longer one (see Extend).
//
// Keys: a lock is stored at its key with the holder's token as the plain
// string value (the layout redsync uses too, so a redsync mutex and a redlease
// lock on the same name exclude each other). The fence counter of a lock lives
// at FenceKey(key), in the same cluster slot, with a TTL refreshed on every
// grant (FenceTTL); a counter created anew starts from the server's clock in
// microseconds, so that fences never go backwards across its expiry. Fence
// counters and boot markers are in the reserved namespace
// (redlease.ReservedPrefix), which Check keeps lock keys out of.
package script

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/drift"
)

// Modes of the Acquire script (ARGV[3]).
const (
	NoFence     = "0" // plain SET NX PX; reply 0 on a grant
	IncrFence   = "1" // on a grant, INCR the fence counter; reply the new value
	QuorumFence = "2" // IncrFence, and on our own key the counter's TTL refreshed (quorum fencing)
)

// Taken is the Acquire script's reply when another token holds the key
// without a TTL (a key someone set by hand). When the holder's key has a
// TTL, the reply carries it instead: use IsTaken and Remaining to read a
// reply.
const Taken = -1

// takenBase is the reply for a holder with 0 ms left; a holder with p ms
// left is takenBase - p. Replies at or below it are refusals.
const takenBase = -3

// Queued is the Acquire script's reply in fair mode when the key is free
// but another waiter is the head of its line (see Acquire). It is a
// refusal (IsTaken) that carries no holder's TTL. It lies far below any
// refusal with a TTL (2^50 ms is 35,000 years).
const Queued = -1 << 50

// IsTaken reports whether an Acquire reply is a refusal: another token
// holds the key, or (Queued) another waiter is ahead in its line.
func IsTaken(v int64) bool { return v == Taken || v <= takenBase }

// Remaining returns the holder's remaining TTL carried by a refusal, as the
// node measured it (PTTL) when it refused; ok is false for a reply that is
// not a refusal or carries none (Queued).
func Remaining(v int64) (d time.Duration, ok bool) {
	if v > takenBase || v == Queued {
		return 0, false
	}
	return time.Duration(takenBase-v) * time.Millisecond, true
}

// Acquire places the lock if the key is free, or refreshes its TTL if it
// already holds our token (a retried request whose first reply was lost;
// raised to ARGV[2], never shortened: see Extend), or takes it over from an earlier attempt of the same acquisition: tokens
// of the form "<base>.<n>" (see redlease.Strategy) with the same base and
// a smaller n. Any other token is taken.
//
// With the delayed-restart rule on (ARGV[4] > 0), it first checks the node's
// boot marker, a key without TTL holding "<ms>:<run_id>": the server time
// when a redlease client first saw this server process, and that process's
// run_id (INFO server; a new one on every start). A missing marker (the node
// lost its data), a marker from another process (the node restarted, maybe
// from an older snapshot or an append-only file that lost its last second,
// and forgot newer locks while keeping the marker), or a marker in the
// future (the clock went back) starts the count again: the marker is set
// now, and the node refuses to vote ("too young") until ARGV[4] ms — the
// longest TTL any client uses — have passed, so that no lock it forgot can
// still be held elsewhere. With ARGV[5] = "1" (nodes declared durable:
// appendfsync always) a restarted process that kept its marker keeps its
// vote; the marker only takes the new run_id. It costs no extra round trip:
// the check is part of the acquire.
//
// With IncrFence, a grant increments the fence counter; a counter created
// anew (INCR answered 1: it did not exist) is set to the server's clock in
// microseconds since the epoch (TIME) instead, and its value is the
// fence. A refresh of our own key replies the counter as it is, or the
// server's clock in microseconds where there is none, and writes nothing.
// QuorumFence is IncrFence but for that refresh: it creates the counter
// from TIME where there is none and refreshes its TTL, so that the node
// then holds, from a moment our key is there, a counter of at least the
// value replied, as after a grant. ARGV[6] > 0: the counter expires no
// sooner than ARGV[6] ms after a grant's reply (its TTL is raised to that,
// never shortened); "0" leaves its TTL as it is (none, for a counter
// created here). Why fences still rise across a counter's expiry is in
// FenceTTL.
//
// Fair mode (ARGV[7] given: the waiter's id, the token's base for a Lock
// call): KEYS[4] is the key's line (QueueKey), a sorted set with two
// members per waiter, its id scored by its ticket (ARGV[8], > 0: the
// client's wall clock in ms at the Lock call; ties order by id) and
// "@"+id scored by minus its deadline in the node's TIME (so that the
// deadlines, all negative, never mix with the tickets). With ARGV[9] =
// "1" the attempt joins the line or refreshes its entry (deadline now +
// ARGV[10] ms; the line key's PTTL is raised to at least that). A free
// key (after entries past their deadline are purged) is then granted only
// if the line is empty or its head is ARGV[7], which leaves the line on
// the grant; otherwise the reply is Queued. A free key with no line is
// granted without joining (one EXISTS: the uncontended cost). A user
// whose ACL refuses EXISTS (one written before fair mode) is served as
// without fairness, never refused for it. The grant
// paths themselves are untouched: the same token's refresh and the
// takeover of an earlier attempt of the same base skip the line, a key
// held by another token is refused, as without fairness. Fairness only ever adds
// refusals.
//
//	KEYS[1] lock key, KEYS[2] fence counter key, KEYS[3] boot marker key,
//	KEYS[4] the line (QueueKey; the lock key again when not fair)
//	ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] mode (NoFence, IncrFence, QuorumFence),
//	ARGV[4] delayed-restart max TTL in ms ("0": rule off),
//	ARGV[5] "1" if nodes are declared durable (read only with the rule on),
//	ARGV[6] fence counter TTL in ms ("0": none),
//	ARGV[7] waiter id (absent: not fair), ARGV[8] ticket in ms,
//	ARGV[9] "1" to join the line, ARGV[10] entry lifetime in ms
//	reply: a refusal (IsTaken; Remaining reads the holder's PTTL from it),
//	Queued, TooYoung, or the fence (0 with NoFence)
//
// A refusal carries the holder's remaining TTL so that a waiting caller
// can bound its wait by it; the grant path is the same whatever a refusal
// says.
var Acquire = newScript(4, `
if ARGV[4] ~= '0' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
  if not run then
    return redis.error_reply('redlease: INFO server shows no run_id, so a restart cannot be told; the delayed-restart rule needs it')
  end
  local boot, seen
  local m = redis.call('GET', KEYS[3])
  if m then
    local b, r = string.match(m, '^(%d+):(%x+)$')
    boot, seen = tonumber(b), r
  end
  if boot == nil or now < boot or (seen ~= run and ARGV[5] ~= '1') then
    redis.call('SET', KEYS[3], now .. ':' .. run)
    boot = now
  elseif seen ~= run then
    redis.call('SET', KEYS[3], boot .. ':' .. run)
  end
  if now - boot < tonumber(ARGV[4]) then
    return -2
  end
end
local held = redis.call('GET', KEYS[1])
local takeover = false
if held ~= false and held ~= ARGV[1] then
  -- An earlier attempt of the same acquisition ("<base>.<n>" with the same
  -- base and a smaller n): its reply was lost, and its undo, which
  -- compares its own token, has not landed. It is ours to take over.
  local hb, hn = string.match(held, '^([%w_-]+)%.(%d+)$')
  local mb, mn = string.match(ARGV[1], '^([%w_-]+)%.(%d+)$')
  if hb ~= nil and hb == mb and tonumber(hn) < tonumber(mn) then
    held = false
    takeover = true
  end
end
local me = ARGV[7]
local fair, lined = false, 0
if me and held ~= ARGV[1] and not takeover then
  -- A user without the rights of fair mode (an ACL written before it)
  -- is refused EXISTS: the line is then ignored, as without fairness.
  lined = redis.pcall('EXISTS', KEYS[4])
  fair = type(lined) == 'number'
end
if fair and (held ~= false or lined == 1) then
  -- Fair mode: join the line, and give a free key to its head only.
  local q = KEYS[4]
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if ARGV[9] == '1' then
    local life = tonumber(ARGV[10])
    redis.call('ZADD', q, ARGV[8], me)
    redis.call('ZADD', q, -(now + life), '@' .. me)
    if redis.call('PTTL', q) < life then
      redis.call('PEXPIRE', q, life)
    end
  end
  if held == false then
    for _, d in ipairs(redis.call('ZRANGEBYSCORE', q, -now, '(0')) do
      redis.call('ZREM', q, d, string.sub(d, 2))
    end
    local head = redis.call('ZRANGEBYSCORE', q, 0, '+inf', 'LIMIT', 0, 1)[1]
    if head ~= nil and head ~= me then
      return -1125899906842624
    end
    redis.call('ZREM', q, me, '@' .. me)
  end
end
if held == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
elseif held == ARGV[1] then
  -- Our own key (a resent request, a late copy): never shortened.
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
else
  local left = redis.call('PTTL', KEYS[1])
  if left < 0 then
    return -1
  end
  return -3 - left
end
if ARGV[3] == '0' then
  return 0
end
local f
if held == false then
  f = redis.call('INCR', KEYS[2])
elseif ARGV[3] == '2' then
  -- Our own key again: the counter as it is, not a new fence.
  f = tonumber(redis.call('GET', KEYS[2]) or '1')
else
  -- Our own key again (IncrFence): the counter as it is, or the server's
  -- clock in microseconds where there is none; nothing written.
  local c = redis.call('GET', KEYS[2])
  if c then
    return tonumber(c)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
if f == 1 then
  -- A counter created anew (never used, or expired) starts from the
  -- server's clock in microseconds: above every fence an expired
  -- counter handed out (see FenceTTL).
  local t = redis.call('TIME')
  f = tonumber(t[1]) * 1000000 + tonumber(t[2])
  redis.call('SET', KEYS[2], string.format('%d', f), 'KEEPTTL')
end
local keep = tonumber(ARGV[6] or '0')
if keep > 0 and redis.call('PTTL', KEYS[2]) < keep then
  redis.call('PEXPIRE', KEYS[2], keep)
end
return f
`)

// TooYoung is the Acquire script's reply from a node that lost its data
// less than the delayed-restart max TTL ago.
const TooYoung = -2

// BootMarker is the key of a node's boot marker (see Acquire). It is one
// key per node, so the delayed-restart rule is for standalone nodes, not
// Cluster clients.
const BootMarker = redlease.ReservedPrefix + "boot"

// Marker returns a boot marker's value: the time (ms since the epoch) a
// client first saw the server process runID. Tests use it to age a marker.
func Marker(ms int64, runID string) string {
	return strconv.FormatInt(ms, 10) + ":" + runID
}

// FenceTTL returns ARGV[6] of Acquire (ARGV[3] of RaiseFence) for a grant
// of ttl: the fence counter's TTL in ms, refreshed on every grant (never
// shortened): d (WithFenceTTL), or with d = 0 the longer of
// redlease.DefaultFenceTTL and ttl. Every fence counter has a TTL.
//
// Fences still rise across a counter's expiry, because a counter created
// anew starts from the server's clock (TIME, microseconds since the
// epoch), not from 1. Say a counter was created at server time c (its
// first fence c, in µs), handed out n fences, the last at time g, and
// expired at g + keep or later (keep: its TTL, refreshed at g). Its last
// fence is c + n - 1. A counter cannot be incremented more than once per
// microsecond (each increment is a script run on one single-threaded
// server, and a grant needs the key free: at least a release or an
// expiry between two grants), so n - 1 <= g - c and the last fence is at
// most g. The next counter starts at a time g' >= g + keep, so its first
// fence g' is above every fence the expired one handed out. Assumption: the
// server's clock does not step back across the expiry by keep or more
// (Redis's own key expiry assumes as much); the margin keep also absorbs
// increments faster than one per microsecond. A holder paused past its
// counter's expiry therefore holds a fence below the next holder's, and
// storage that keeps the highest fence it saw refuses its write.
//
// Quorum fencing (each granting node increments its counter, the fence
// is the highest of a majority's replies, and RaiseFence raises nodes to
// it where fewer than a majority replied that value) compares counters
// across nodes: a fence from one node's clock reaches others. Any two
// majorities share a node, which held a counter of at least the last
// holder's fence f at some time r (its TTL refreshed to keep then); the
// next holder increments there either that counter (to more than f) or,
// after its expiry, starts from the node's TIME >= r + keep, which is
// above f as long as the nodes' clocks differ by less than keep (less the
// margin above). The default keep of redlease.DefaultFenceTTL leaves
// minutes for both.
//
// The counter need not outlive the lock it fenced (extensions do not
// refresh it): while a key is held nobody else is granted it, and
// whenever the next grant comes, it is above the counter's last fence,
// whether the counter lived on or expired. Values stay below 2^53 (exact
// in Lua's numbers) until the year 2255.
func FenceTTL(d, ttl time.Duration) any {
	if d <= 0 {
		if ttl <= redlease.DefaultFenceTTL {
			return defaultFenceTTL
		}
		d = ttl
	}
	return strconv.FormatInt(d.Milliseconds(), 10)
}

// NoFenceTTL is ARGV[6] of Acquire (ARGV[3] of RaiseFence) that leaves a
// fence counter without a TTL. No strategy sends it (every counter gets
// FenceTTL's); it is for a command line without fencing (NoFence).
const NoFenceTTL = "0"

// defaultFenceTTL is redlease.DefaultFenceTTL in ms, boxed once.
var defaultFenceTTL any = strconv.FormatInt(redlease.DefaultFenceTTL.Milliseconds(), 10)

// Durable and NotDurable are ARGV[5] of Acquire.
const (
	Durable    = "1"
	NotDurable = "0"
)

// RuleOff is ARGV[4] of Acquire with the delayed-restart rule off.
const RuleOff = "0"

// RaiseFence is the second round of quorum fencing (for an acquisition
// whose grants replied the fence on fewer than a quorum of nodes): it
// raises the node's fence counter to at least the chosen fence (counters only ever rise, so raising one on a
// node we do not hold is harmless), and reports whether the lock key still
// holds our token here, which is what the grant counts.
//
//	KEYS[1] lock key, KEYS[2] fence counter key
//	ARGV[1] token, ARGV[2] fence, ARGV[3] fence counter TTL in ms ("0": none;
//	as in Acquire, never shortened)
//	reply: 1 if KEYS[1] holds ARGV[1], else 0
var RaiseFence = newScript(2, `
local f = tonumber(ARGV[2])
if f > tonumber(redis.call('GET', KEYS[2]) or '0') then
  redis.call('SET', KEYS[2], ARGV[2], 'KEEPTTL')
end
local keep = tonumber(ARGV[3] or '0')
if keep > 0 and redis.call('PTTL', KEYS[2]) < keep then
  redis.call('PEXPIRE', KEYS[2], keep)
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return 1
end
return 0
`)

// Extend raises the TTL of a lock we hold to ARGV[2]: it sets it only if
// the key's PTTL is below that (a key without expiry gets it too), and
// never shortens the key. A late copy of an earlier, shorter extension
// (a quorum's request still in flight to a node after the call returned,
// a resent request) may land after a later, longer one, over another
// connection, with nothing to order them: were it to reset the TTL, it
// would cut the key back below the longer one's Until. The reply is 1
// either way: the key lives at least ARGV[2] from now, which is all an
// extension to that TTL vouches for.
//
//	KEYS[1] lock key; ARGV[1] token, ARGV[2] ttl in ms
//	reply: 1 if held (its TTL now at least ARGV[2]), 0 if the key is gone or not ours
var Extend = newScript(1, `
if redis.call('GET', KEYS[1]) == ARGV[1] then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
return 0
`)

// Release deletes a lock we hold and, in the same atomic step, publishes
// on the key's wake channel (Channel), so that a waiter subscribed to it
// tries again at once. The channel is named after the line's key (KEYS[2],
// QueueKey: the same suffix after "redlease:queue:" as the channel's after
// "redlease:wake:"), so one string serves both. The message is the id of
// the line's head (after entries past their deadline are purged), or,
// when the line is empty, "~" and the released token (wake.ReleaseMark): on a
// quorum every node publishes the same release, and a process that hears
// it from five nodes wakes one waiter for it (wake's pick). An undo
// (ARGV[2] = "0") publishes "!" (wake.UndoNotice; it does not read the
// line for a head it would not name), which waiters answer after a pause
// that grows with each undo, not at once: a failed attempt's undo is not
// a release. With ARGV[2] = "1" (a holder's release,
// not the undo of a failed attempt) it also removes the entry of the
// token's base from the line, whether or not the key was ours here: the
// nodes that refused the holder's grant still had it in line. Everything
// but the compare-and-delete runs under redis.pcall: a user whose ACL does
// not allow PUBLISH (Redis 7's default for new users is no channels) or
// the line's key still releases; waiters then learn of the release by
// polling.
//
//	KEYS[1] lock key, KEYS[2] the line (QueueKey); ARGV[1] token,
//	ARGV[2] "1" to leave the line ("0": an undo)
//	reply: 1 if deleted, 0 if the key is gone or not ours
var Release = newScript(2, `
local n = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  n = redis.call('DEL', KEYS[1])
end
local q = KEYS[2]
local head = ''
if redis.pcall('EXISTS', q) == 1 then
  if ARGV[2] == '1' then
    local base = string.match(ARGV[1], '^([%w_-]+)%.%d+$')
    if base then
      redis.pcall('ZREM', q, base, '@' .. base)
    end
  end
  if n == 1 and ARGV[2] == '1' then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local dead = redis.pcall('ZRANGEBYSCORE', q, -now, '(0')
    if type(dead) == 'table' and dead.err == nil then
      for _, d in ipairs(dead) do
        redis.pcall('ZREM', q, d, string.sub(d, 2))
      end
    end
    local h = redis.pcall('ZRANGEBYSCORE', q, 0, '+inf', 'LIMIT', 0, 1)
    if type(h) == 'table' and h.err == nil and h[1] then
      head = h[1]
    end
  end
end
if n == 1 then
  if ARGV[2] ~= '1' then
    head = '!'
  elseif head == '' then
    head = '~' .. ARGV[1]
  end
  redis.pcall('PUBLISH', 'redlease:wake:' .. string.sub(q, 16), head)
end
return n
`)

// leave and stay are ARGV[2] of Release, boxed once.
var (
	leave any = "1"
	stay  any = "0"
)

// ReleaseArgs returns the Release command line of a holder's release of
// key under token: it leaves the line too.
func ReleaseArgs(key string, token any) []any {
	return Release.Args(key, QueueKey(key), token, leave)
}

// AppendReleaseArgs is ReleaseArgs appended to line.
func AppendReleaseArgs(line []any, key string, token any) []any {
	return Release.AppendArgs(line, key, QueueKey(key), token, leave)
}

// UndoArgs returns the Release command line of the undo of a failed
// attempt under token: it deletes the attempt's key, and leaves the
// waiter's entry in the line (the waiter is still waiting).
func UndoArgs(key string, token any) []any {
	return Release.Args(key, QueueKey(key), token, stay)
}

// Leave removes a waiter's entry from the key's line, and if the key is
// free, publishes the line's new head on its wake channel (the leaver may
// have been the head, which the next waiter would otherwise learn only
// by its backoff).
//
//	KEYS[1] lock key, KEYS[2] the line (QueueKey); ARGV[1] waiter id
//	reply: the number of members removed (0 or 2)
var Leave = newScript(2, `
local q = KEYS[2]
local n = redis.call('ZREM', q, ARGV[1], '@' .. ARGV[1])
if n > 0 and redis.call('EXISTS', KEYS[1]) == 0 then
  local h = redis.call('ZRANGEBYSCORE', q, 0, '+inf', 'LIMIT', 0, 1)[1]
  redis.pcall('PUBLISH', 'redlease:wake:' .. string.sub(q, 16), h or '')
end
return n
`)

// LeaveArgs returns the Leave command line of waiter id on key.
func LeaveArgs(key, id string) []any {
	return Leave.Args(key, QueueKey(key), id)
}

// AppendLeaveArgs is LeaveArgs appended to line.
func AppendLeaveArgs(line []any, key, id string) []any {
	return Leave.AppendArgs(line, key, QueueKey(key), id)
}

// QueueKey returns the key of a lock key's line (fair mode; see Acquire),
// built like Channel, in the key's cluster slot and the reserved
// namespace: "redlease:queue:tag:"+key for a key with a hash tag,
// "redlease:queue:{"+key+"}" otherwise ("redlease:queue:"+key for a key
// that Check rejects). The Release and Leave scripts name the wake
// channel after it: "redlease:wake:" and the same suffix.
func QueueKey(key string) string {
	if hasHashTag(key) {
		return queuePrefix + "tag:" + key
	}
	if strings.IndexByte(key, '}') >= 0 {
		return queuePrefix + key
	}
	return queuePrefix + "{" + key + "}"
}

// queuePrefix starts every line's key; its length (15) is wired into the
// scripts that derive the wake channel from it.
const queuePrefix = redlease.ReservedPrefix + "queue:"

// Fair mode's ARGV[9] of Acquire, boxed once.
var (
	join   any = "1"
	noJoin any = "0"
)

// AppendPlace appends fair mode's arguments (ARGV[7] to ARGV[10]) for
// place to an Acquire command line whose KEYS[4] is the line.
func AppendPlace(line []any, place redlease.Place) []any {
	j := noJoin
	if place.Join {
		j = join
	}
	return append(line, place.ID, place.Ticket.UnixMilli(), j, place.Lifetime.Milliseconds())
}

// CheckPlace validates a waiter's place (redlease.ErrInvalid).
func CheckPlace(p redlease.Place) error {
	switch {
	case p.ID == "":
		return redlease.Invalid("place: empty waiter id")
	case p.Ticket.UnixMilli() <= 0:
		return redlease.Invalid("place: ticket %v: must be after the Unix epoch", p.Ticket)
	case p.Join && p.Lifetime < time.Millisecond:
		return redlease.Invalid("place: entry lifetime %v: must be at least 1ms", p.Lifetime)
	}
	return nil
}

// Channel returns the wake channel of a lock key: Release publishes on it,
// waiters subscribe to it. It lies in the reserved namespace, like the
// fence counters (no lock key may start with redlease.ReservedPrefix, so
// no channel of a lock is a counter's or another lock's), and is built
// like FenceKey, in the key's cluster slot: "redlease:wake:tag:"+key for a
// key with a hash tag, "redlease:wake:{"+key+"}" otherwise. (Plain PUBLISH
// ignores slots; keeping the slot leaves sharded pub/sub open.) A key that
// Check rejects gets "redlease:wake:"+key, which no waiter subscribes to.
func Channel(key string) string {
	prefix, suffix := channelParts(key)
	return prefix.(string) + key + suffix.(string)
}

// channelParts returns what goes before and after key in its wake
// channel (see Channel), as constants already in interfaces (no
// allocation).
func channelParts(key string) (prefix, suffix any) {
	switch {
	case hasHashTag(key):
		return wakePrefix + "tag:", ""
	case strings.IndexByte(key, '}') >= 0:
		return wakePrefix, ""
	}
	return wakePrefix + "{", "}"
}

// wakePrefix starts every wake channel.
const wakePrefix = redlease.ReservedPrefix + "wake:"

// Script is a Lua script with a fixed number of keys, run with EVALSHA and,
// when the node does not know the script yet (first use, restart, SCRIPT
// FLUSH), with EVAL, which also caches it there.
//
// It differs from calling redis.Script.Run in one way: the command line is
// built once per round (Args) and the same slice is sent to every node, so a
// round boxes its arguments once, whatever the number of nodes.
// go-redis only reads a command's arguments, so sharing the slice across
// goroutines is safe.
type Script struct {
	script  *redis.Script // computes the SHA1 the same way go-redis does
	src     string
	sha     any // pre-boxed for Args
	numKeys int // -1: given per call
}

func newScript(numKeys int, src string) *Script {
	s := redis.NewScript(src)
	return &Script{script: s, src: src, sha: s.Hash(), numKeys: numKeys}
}

// New returns a Script of numKeys keys (-1: given per call) made of src,
// for a script of another package that runs with this package's command
// lines (Args, boxed once per call): the idempotency Barrier's combined
// scripts. go-redis's redis.Script would box its SHA1 and every key again
// on every call.
func New(numKeys int, src string) *Script { return newScript(numKeys, src) }

// Hash returns the script's SHA1, as EVALSHA sends it.
func (s *Script) Hash() string { return s.script.Hash() }

// Source returns the script's Lua source, for a script of another package
// that runs this one's logic inside its own atomic step as a local
// function, so that it keeps no copy of it: the idempotency Barrier's
// undo of a claim releases the lock with Release's source.
func (s *Script) Source() string { return s.src }

// Args returns the EVALSHA command line for keysThenArgs, which must start
// with the script's keys.
func (s *Script) Args(keysThenArgs ...any) []any {
	return s.AppendArgs(make([]any, 0, 3+len(keysThenArgs)), keysThenArgs...)
}

// AppendArgs is Args appended to line: into an array the caller allocated
// with the rest of its call (see internal/primary).
func (s *Script) AppendArgs(line []any, keysThenArgs ...any) []any {
	line = append(line, "evalsha", s.sha, s.numKeys)
	return append(line, keysThenArgs...)
}

// Load puts the script into the script cache of c (every shard of a Cluster
// client), so that EVALSHA finds it.
func (s *Script) Load(ctx context.Context, c redis.Scripter) error {
	return s.script.Load(ctx, c).Err()
}

// IsNoScript reports whether err says the node did not know a script.
func IsNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// LineMany returns the EVALSHA command line of a script whose key count is
// given per call (ExtendMany).
func (s *Script) LineMany(keys []any, args []any) []any {
	line := make([]any, 0, 3+len(keys)+len(args))
	line = append(line, "evalsha", s.sha, len(keys))
	line = append(line, keys...)
	return append(line, args...)
}

// LineLocal returns ExtendMany's command line in its local layout (no
// declared key): triples holds key, token and ttl in ms for each lock.
func (s *Script) LineLocal(triples []any) []any {
	line := make([]any, 0, 3+len(triples))
	line = append(line, "evalsha", s.sha, 0)
	return append(line, triples...)
}

// RunInts is Run for scripts that reply with an array of integers.
func (s *Script) RunInts(ctx context.Context, c Doer, line []any) ([]int64, error) {
	v, err := c.Do(ctx, line...).Int64Slice()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		eval := slices.Clone(line)
		eval[0], eval[1] = "eval", s.src
		v, err = c.Do(ctx, eval...).Int64Slice()
	}
	return v, err
}

// Doer is the one client method Run needs; every go-redis client has it.
type Doer interface {
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// Run sends a command line from Args to c and returns the integer reply.
func (s *Script) Run(ctx context.Context, c Doer, line []any) (int64, error) {
	v, err := c.Do(ctx, line...).Int64()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		eval := slices.Clone(line)
		eval[0], eval[1] = "eval", s.src
		v, err = c.Do(ctx, eval...).Int64()
	}
	return v, err
}

// RunValue is Run for a script whose reply is not always an integer: it
// returns the reply as go-redis reads it (an int64, a string, a []any),
// and redis.Nil for a nil reply.
func (s *Script) RunValue(ctx context.Context, c Doer, line []any) (any, error) {
	v, err := c.Do(ctx, line...).Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		v, err = c.Do(ctx, s.Eval(line)...).Result()
	}
	return v, err
}

// Identify answers with the node's run_id (INFO server; a new one on every
// start), as an integer: its first 13 hex digits (52 bits, exact in Lua's
// numbers), or 0 if the node shows none. Two entries of a quorum that
// answer the same number are one server.
var Identify = newScript(0, `
local run = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if not run then
  return 0
end
return tonumber(string.sub(run, 1, 13), 16)
`)

// ExtendMany raises the TTL of many locks we hold, in one call, each to
// its own ttl as Extend does (never shortened), and answers for every key
// on its own: a key the node cannot read as a string does not abort the
// call (redis.pcall), so it costs no other key its extension. Two layouts:
//
//	declared (LineMany): KEYS[i] lock key i; ARGV[2i-1] its token, ARGV[2i] its ttl in ms
//	local (LineLocal):   no KEYS; ARGV[3i-2] lock key i, ARGV[3i-1] its token, ARGV[3i] its ttl
//	reply: array, element i one of Extended, NotOurs, WrongType, KeyFailed
//
// The local layout is for a Redis Cluster master: a script that declares
// no key may touch keys of several slots, as long as the node serves them
// (Redis 7 refuses only scripts flagged otherwise), so one call renews a
// master's keys whatever their slots. A key the node does not serve, or
// no longer has because its slot is migrating (ASK), fails that key alone
// with "non local key", which is KeyFailed: the caller sends it again on
// its own, following the redirection.
//
// A key that holds a value of another type (a hash, a list: GET answers
// WRONGTYPE) cannot hold our token, so WrongType means "not held" as
// surely as NotOurs; the reply says which, so that the caller can name the
// cause. KeyFailed is any other error on that key; the node's message is
// not carried (the reply is an array of integers), and the caller must
// treat that key as undecided.
var ExtendMany = newScript(-1, `
local out = {}
local n, step = #KEYS, 2
if n == 0 then
  n, step = #ARGV / 3, 3
end
for i = 1, n do
  local key, tok, ttl
  if step == 2 then
    key, tok, ttl = KEYS[i], ARGV[2*i-1], ARGV[2*i]
  else
    key, tok, ttl = ARGV[3*i-2], ARGV[3*i-1], ARGV[3*i]
  end
  local v = redis.pcall('GET', key)
  if v == tok then
    ttl = tonumber(ttl)
    v = redis.pcall('PTTL', key)
    if type(v) == 'number' and v < ttl then
      v = redis.pcall('PEXPIRE', key, ttl)
    end
    if type(v) == 'number' then
      out[i] = 1
    else
      out[i] = -2
    end
  elseif type(v) == 'table' then
    if string.sub(tostring(v.err), 1, 9) == 'WRONGTYPE' then
      out[i] = -1
    else
      out[i] = -2
    end
  else
    out[i] = 0
  end
end
return out
`)

// The per-key replies of ExtendMany.
const (
	Extended  = 1  // the key held our token; its TTL is now at least the one asked
	NotOurs   = 0  // the key is missing or holds another token
	WrongType = -1 // the key holds a value of another type: not ours either
	KeyFailed = -2 // the node refused a command on this key: undecided
)

// ErrWrongType is the cause recorded for a key that held a value of
// another type (ExtendMany's WrongType). It is the node's own WRONGTYPE
// error, re-made on the client, so go-redis's predicates recognise it:
// redis.HasErrorPrefix(err, "WRONGTYPE").
var ErrWrongType error = redisError("WRONGTYPE Operation against a key holding the wrong kind of value")

// ErrKeyFailed is the cause recorded for a key on which the node refused a
// command inside ExtendMany with an error other than WRONGTYPE
// (KeyFailed).
var ErrKeyFailed = errors.New("the node refused a command on this key inside the batch (an error other than WRONGTYPE; the node's message is not carried)")

// KeyCause returns the cause of an ExtendMany element that is neither
// Extended nor NotOurs: ErrWrongType, ErrKeyFailed, or an error naming a
// reply the script never gives.
func KeyCause(v int64) error {
	switch v {
	case WrongType:
		return ErrWrongType
	case KeyFailed:
		return ErrKeyFailed
	}
	return fmt.Errorf("extend batch: unexpected reply %d for a key", v)
}

// redisError is an error text as a Redis node sends it; it satisfies
// redis.Error.
type redisError string

var _ redis.Error = redisError("")

// Error returns the text.
func (e redisError) Error() string { return string(e) }

// RedisError marks the type as a Redis error for go-redis's predicates.
func (redisError) RedisError() {}

// Eval returns the EVAL form of a command line from Args or LineMany: the
// script's source in place of its SHA1, for a node that answered NOSCRIPT.
func (s *Script) Eval(line []any) []any {
	eval := slices.Clone(line)
	eval[0], eval[1] = "eval", s.src
	return eval
}

// MaxBatch bounds the keys in one ExtendMany call: Redis runs a script to
// completion before serving anyone else, so a batch must stay short (500
// keys take well under a millisecond).
const MaxBatch = 500

// FenceKey returns the key of the fence counter that belongs to key. It
// lies in the reserved namespace (redlease.ReservedPrefix), which no lock
// key may enter, and is chosen so that both hash to the same Redis Cluster
// slot (a script may only touch keys of one slot):
//
//   - key with a hash tag ("{order:7}:lock"): "redlease:fence:tag:" + key,
//     which keeps the tag as the first one;
//   - key without braces ("order:7"): "redlease:fence:{" + key + "}", which
//     tags the whole key.
//
// The two forms cannot meet (after "redlease:fence:" one goes on with "tag:",
// the other with "{"), and each is one to one, so two lock keys never share
// a counter. A key that contains '}' but no valid hash tag cannot be given
// a same-slot companion; ok is false and the caller must reject it.
func FenceKey(key string) (fk string, ok bool) {
	if hasHashTag(key) {
		return fencePrefix + "tag:" + key, true
	}
	if strings.IndexByte(key, '}') >= 0 {
		return "", false
	}
	return fencePrefix + "{" + key + "}", true
}

// fencePrefix starts every fence counter key.
const fencePrefix = redlease.ReservedPrefix + "fence:"

// MustFenceKey is FenceKey for a key that passed Check.
func MustFenceKey(key string) string {
	fk, ok := FenceKey(key)
	if !ok {
		panic("script: MustFenceKey on a key that Check rejects: " + key) // a bug in the caller, not bad input
	}
	return fk
}

// hasHashTag applies Redis Cluster's rule: a '{' followed later by a '}'
// with at least one byte between the first such pair.
func hasHashTag(key string) bool {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return false
	}
	end := strings.IndexByte(key[open+1:], '}')
	return end > 0
}

// Check validates the arguments every strategy call shares. Errors are
// redlease.ErrInvalid. It allocates nothing; FenceKey builds the companion
// key where one is needed.
func Check(key, token string, ttl time.Duration, driftFactor float64) error {
	switch {
	case key == "":
		return redlease.Invalid("empty key")
	case token == "":
		return redlease.Invalid("empty token")
	case ttl < time.Millisecond:
		return redlease.Invalid("ttl %v: must be at least 1ms", ttl)
	case ttl <= drift.Allowance(ttl, driftFactor):
		return redlease.Invalid("ttl %v: no validity left after the drift allowance of %v",
			ttl, drift.Allowance(ttl, driftFactor))
	case !hasHashTag(key) && strings.IndexByte(key, '}') >= 0:
		return redlease.Invalid("key %q: contains '}' without a hash tag, so no fence key can share its cluster slot", key)
	case strings.HasPrefix(key, redlease.ReservedPrefix):
		return redlease.Invalid("key %q: keys starting with %q are redlease's own (fence counters, boot markers)", key, redlease.ReservedPrefix)
	}
	return nil
}
