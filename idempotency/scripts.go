package idempotency

import (
	"github.com/redis/go-redis/v9"

	"github.com/redlease/redlease/internal/script"
)

// The record of one idempotency key is a hash:
//
//	state  "p" (in progress) or "c" (completed)
//	owner  the owner's token (its lock token): in progress, whoever runs it;
//	       completed, whoever completed it (so a retried complete whose
//	       first attempt landed knows it was its own)
//	fence  the owner's fence (its lock fence), so a later owner can take over
//	fp     the payload fingerprint of the first request ("" if none given)
//	ls     the lock scheme of the owner's lock (Barrier.scheme): a claim
//	       through another scheme never takes the record over. A record
//	       without it (written before it existed) is taken over by any.
//	result the stored result (completed only)
//	kind   what result is: "ok", "err" (a stored failure) or "big" (too large to keep)
//
// Every step is one script, so there is no GET-then-SET window anywhere,
// and every step that changes an in-progress record checks its owner.

// peekScript classifies a request without taking anything.
//
//	KEYS[1] record; ARGV[1] fingerprint
//	reply: {"none"} | {"done", kind, result} | {"progress"} | {"mismatch"}
const peekSrc = `
local r = redis.call('HMGET', KEYS[1], 'state', 'fp', 'kind', 'result')
if not r[1] then return {'none'} end
if ARGV[1] ~= '' and r[2] ~= '' and r[2] ~= ARGV[1] then return {'mismatch'} end
if r[1] == 'c' then return {'done', r[3], r[4] or ''} end
return {'progress'}
`

var peekScript = redis.NewScript(peekSrc)

// claimScript makes the caller (who holds the key's lock) the owner of the
// record, unless the request is already done or its payload differs. An
// in-progress record of another owner is taken over: that owner's lock
// expired, since we hold it now (its later Complete will be refused) —
// unless its fence is higher than ours, which only a double grant
// produces, or it was claimed through another lock scheme, whose lock
// ours does not exclude (its owner may be running now).
//
//	KEYS[1] record; ARGV[1] owner, ARGV[2] fence, ARGV[3] fingerprint,
//	ARGV[4] retention ms, ARGV[5] lock scheme
//	reply: {"claimed"} | {"done", kind, result} | {"mismatch"} | {"progress"}
const claimSrc = `
local r = redis.call('HMGET', KEYS[1], 'state', 'fp', 'kind', 'result', 'owner', 'fence', 'ls')
if r[1] then
  if ARGV[3] ~= '' and r[2] ~= '' and r[2] ~= ARGV[3] then return {'mismatch'} end
  if r[1] == 'c' then return {'done', r[3], r[4] or ''} end
  -- We hold the key's lock, so another in-progress owner of the same lock
  -- scheme lost its lock: take over, unless fences say that owner came
  -- after us (a double grant). An owner of another scheme holds a lock
  -- ours does not exclude: never taken over.
  if r[5] ~= ARGV[1] and r[7] and r[7] ~= ARGV[5] then return {'progress'} end
  if r[5] ~= ARGV[1] and tonumber(ARGV[2]) > 0 and tonumber(r[6] or '0') > tonumber(ARGV[2]) then
    return {'progress'}
  end
end
local fp = ARGV[3]
if r[1] and fp == '' then fp = r[2] end
redis.call('HSET', KEYS[1], 'state', 'p', 'owner', ARGV[1], 'fence', ARGV[2], 'fp', fp, 'ls', ARGV[5])
if r[1] then
  redis.call('HDEL', KEYS[1], 'kind', 'result')
end
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {'claimed'}
`

var claimScript = redis.NewScript(claimSrc)

// completeScript stores the result, if the caller still owns the record.
// It may be sent again after a failure whose first attempt landed: a
// record this owner already completed answers 1 again.
//
//	KEYS[1] record; ARGV[1] owner, ARGV[2] kind, ARGV[3] result, ARGV[4] retention ms
//	reply: 1 stored (now, or by an earlier attempt of the same owner),
//	       0 not the owner (taken over), -1 no record (expired, or lost)
const completeSrc = `
local r = redis.call('HMGET', KEYS[1], 'state', 'owner')
if not r[1] then return -1 end
if r[2] ~= ARGV[1] then return 0 end
if r[1] == 'c' then return 1 end
redis.call('HSET', KEYS[1], 'state', 'c', 'kind', ARGV[2], 'result', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
`

var completeScript = script.New(1, completeSrc)

// renewScript keeps an in-progress record alive while its owner runs:
// its TTL becomes at least ARGV[2] (never shortened), if the caller owns
// it and it is in progress.
//
//	KEYS[1] record; ARGV[1] owner, ARGV[2] retention ms
//	reply: 1 renewed (or already long enough), 0 not the owner, or not in progress
var renewScript = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'state', 'owner')
if r[1] ~= 'p' or r[2] ~= ARGV[1] then return 0 end
local keep = tonumber(ARGV[2])
local left = redis.call('PTTL', KEYS[1])
if left >= 0 and left < keep then
  redis.call('PEXPIRE', KEYS[1], keep)
end
return 1
`)

// releaseScript forgets an in-progress record so a retry can run, if the
// caller owns it: nobody else's record is ever deleted.
//
//	KEYS[1] record; ARGV[1] owner
//	reply: 1 released, 0 not the owner
const releaseSrc = `
local r = redis.call('HMGET', KEYS[1], 'state', 'owner')
if r[1] ~= 'p' or r[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
`

var releaseScript = redis.NewScript(releaseSrc)

// When the request's lock lives on the store (the default strategy: single
// on the store's own client, see storeLock), the steps of a first request
// run in two scripts: claimLockScript (peek, the lock's acquisition,
// claim), and completeScript, after which the lock is left to expire (see
// Barrier.leavesLock). claimLockScript does, step for step, what
// peekScript, the single strategy's Acquire with fencing and claimScript
// do when run one after the other: the same record, the same lock key
// holding the same token, the same fence counter and its TTL, the same
// takeover of an earlier attempt's key, the same answers. It is written
// out by hand, not composed of those scripts, because a first request's
// cost is mostly the store's work, and every call a script makes costs
// one to two microseconds on the machine we measure on
// (docs/bench/PERFORMANCE.md), whatever the command. So it reads the
// record once, takes a free lock key and starts a new fence counter with
// one SET NX each (the counter's after TIME), and has no branches for
// modes the store lock never uses (fair mode's line: the Barrier's Locker
// is never fair, so the line never exists) nor local functions to build
// on every call. TestHandWrittenClaimDoesWhatTheComposedOneDoes runs it
// against the composed scripts from every state that matters to it. Its
// reply is flattened to one integer or one string, which the client reads
// without building an array.

// fn makes a script's source a local function of a larger script.
func fn(name, src string) string {
	return "local function " + name + "(KEYS, ARGV)\n" + src + "\nend\n"
}

// claimLockScript classifies a request and, unless it is done or its
// payload differs, takes the request's lock and claims its record, in one
// atomic step: peekScript, then script.Acquire with fencing (not fair,
// the delayed-restart rule off), then claimScript under the fence just
// granted. A lock held by another token is refused as Acquire refuses it
// (with the holder's PTTL), and nothing is claimed.
//
//	KEYS[1] record, KEYS[2] lock key, KEYS[3] its fence counter
//	ARGV[1] token (the lock's, and the record's owner), ARGV[2] lock ttl ms,
//	ARGV[3] fence counter TTL ms (> 0; never shortened), ARGV[4]
//	fingerprint, ARGV[5] retention ms, ARGV[6] lock scheme
//	reply: "d"..kind..":"..result  done (lock not taken)
//	     | "m"                     mismatch (lock not taken)
//	     | an integer < 0          the lock refused: Acquire's refusal
//	     | an integer > 0          the lock taken (this fence), the record claimed
//	     | "p"..fence              the lock taken, but the record is in progress
//	                               under a higher fence (a double grant), or
//	                               under another lock scheme
var claimLockScript = script.New(3, `
local r = redis.call('HMGET', KEYS[1], 'state', 'fp', 'kind', 'result', 'owner', 'fence', 'ls')
if r[1] then
  if ARGV[4] ~= '' and r[2] ~= '' and r[2] ~= ARGV[4] then return 'm' end
  if r[1] == 'c' then return 'd' .. (r[3] or '') .. ':' .. (r[4] or '') end
end
-- The lock. With no record (a first request, the common case) SET NX
-- takes a free key in one call; with a record in progress (a duplicate,
-- whose key is most likely held) the key is read first. A key that is
-- held is handled as script.Acquire handles it.
local fresh = false
if not r[1] then
  fresh = redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2])
end
local f
if not fresh then
  local held = redis.call('GET', KEYS[2])
  if held == ARGV[1] then
    -- Our own token: a retried request whose first reply was lost. As
    -- in script.Acquire, a held key is never shortened.
    if redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
      redis.call('PEXPIRE', KEYS[2], ARGV[2])
    end
    f = redis.call('GET', KEYS[3])
    if f then
      f = tonumber(f)
    else
      local t = redis.call('TIME')
      f = tonumber(t[1]) * 1000000 + tonumber(t[2])
    end
  else
    if held ~= false then
      -- An earlier attempt of the same acquisition ("<base>.<n>", the
      -- same base, a smaller n) is ours to take over; any other token
      -- is a refusal, with the holder's PTTL.
      local hb, hn = string.match(held, '^([%w_-]+)%.(%d+)$')
      local mb, mn = string.match(ARGV[1], '^([%w_-]+)%.(%d+)$')
      if hb == nil or hb ~= mb or tonumber(hn) >= tonumber(mn) then
        local left = redis.call('PTTL', KEYS[2])
        if left < 0 then return -1 end
        return -3 - left
      end
    end
    redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
    fresh = true
  end
end
if fresh then
  -- The next fence: a counter that does not exist starts from the
  -- server's clock in microseconds with its TTL in one call (as
  -- script.Acquire would leave it); one that does is raised, and its TTL
  -- raised to at least ARGV[3], never shortened.
  local keep = tonumber(ARGV[3])
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if keep > 0 and redis.call('SET', KEYS[3], string.format('%d', now), 'NX', 'PX', ARGV[3]) then
    f = now
  else
    f = redis.call('INCR', KEYS[3])
    if keep > 0 and redis.call('PTTL', KEYS[3]) < keep then
      redis.call('PEXPIRE', KEYS[3], keep)
    end
  end
end
if f < 0 then return f end
local fence = string.format('%d', f)
-- We hold the key's lock, so another in-progress owner of the same lock
-- scheme lost its lock: take over, unless fences say that owner came
-- after us (a double grant). An owner of another scheme: never.
if r[1] and r[5] ~= ARGV[1] and ((r[7] and r[7] ~= ARGV[6]) or (f > 0 and tonumber(r[6] or '0') > f)) then
  return 'p' .. fence
end
local fp = ARGV[4]
if r[1] and fp == '' then fp = r[2] end
redis.call('HSET', KEYS[1], 'state', 'p', 'owner', ARGV[1], 'fence', fence, 'fp', fp, 'ls', ARGV[6])
if r[1] then
  redis.call('HDEL', KEYS[1], 'kind', 'result')
end
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return f
`)

// undoClaimScript undoes what claimLockScript did for one token: it
// forgets the record if that token still owns it in progress
// (releaseScript) and releases the lock if it still holds that token
// (script.Release: ARGV[2] "0" for the undo of a failed attempt, which
// publishes wake.UndoNotice, "1" for a grant given back, a holder's
// release). Nothing another token wrote is touched, however late it
// lands.
//
//	KEYS[1] record, KEYS[2] lock key, KEYS[3] its line (script.QueueKey)
//	ARGV[1] token, ARGV[2] "0" undo, "1" release
//	reply: 2*f + r, f releaseScript's reply, r script.Release's
var undoClaimScript = script.New(3, fn("forget", releaseSrc)+fn("release", script.Release.Source())+`
return 2 * forget({KEYS[1]}, {ARGV[1]}) + release({KEYS[2], KEYS[3]}, {ARGV[1], ARGV[2]})
`)

// consumeScript consumes a one-time token, for one call of Consume: the
// token's key then holds "used:" and that call's nonce, with the TTL
// ARGV[1], so that the same call sent again (its reply was lost, and the
// client resent it) answers 1 again, while any other call answers -1. A
// key holding "used" alone (no nonce) is used too.
//
//	KEYS[1] token key; ARGV[1] how long to remember a used token, ms;
//	ARGV[2] the call's nonce
//	reply: 1 consumed (now, or by this call before), 0 unknown (or
//	expired), -1 already used
var consumeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if v == 'used:' .. ARGV[2] then return 1 end
if v == 'used' or string.sub(v, 1, 5) == 'used:' then return -1 end
redis.call('SET', KEYS[1], 'used:' .. ARGV[2], 'PX', ARGV[1])
return 1
`)
