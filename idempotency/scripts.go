package idempotency

import "github.com/redis/go-redis/v9"

// The record of one idempotency key is a hash:
//
//	state  "p" (in progress) or "c" (completed)
//	owner  the owner's token (its lock token): in progress, whoever runs it;
//	       completed, whoever completed it (so a retried complete whose
//	       first attempt landed knows it was its own)
//	fence  the owner's fence (its lock fence), so a later owner can take over
//	fp     the payload fingerprint of the first request ("" if none given)
//	result the stored result (completed only)
//	kind   what result is: "ok", "err" (a stored failure) or "big" (too large to keep)
//
// Every step is one script, so there is no GET-then-SET window anywhere,
// and every step that changes an in-progress record checks its owner.

// peekScript classifies a request without taking anything.
//
//	KEYS[1] record; ARGV[1] fingerprint
//	reply: {"none"} | {"done", kind, result} | {"progress"} | {"mismatch"}
var peekScript = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'state', 'fp', 'kind', 'result')
if not r[1] then return {'none'} end
if ARGV[1] ~= '' and r[2] ~= '' and r[2] ~= ARGV[1] then return {'mismatch'} end
if r[1] == 'c' then return {'done', r[3], r[4] or ''} end
return {'progress'}
`)

// claimScript makes the caller (who holds the key's lock) the owner of the
// record, unless the request is already done or its payload differs. An
// in-progress record of another owner is taken over: that owner's lock
// expired, since we hold it now (its later Complete will be refused) —
// unless its fence is higher than ours, which only a double grant produces.
//
//	KEYS[1] record; ARGV[1] owner, ARGV[2] fence, ARGV[3] fingerprint, ARGV[4] retention ms
//	reply: {"claimed"} | {"done", kind, result} | {"mismatch"} | {"progress"}
var claimScript = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'state', 'fp', 'kind', 'result', 'owner', 'fence')
if r[1] then
  if ARGV[3] ~= '' and r[2] ~= '' and r[2] ~= ARGV[3] then return {'mismatch'} end
  if r[1] == 'c' then return {'done', r[3], r[4] or ''} end
  -- We hold the key's lock, so another in-progress owner lost its lock:
  -- take over, unless fences say that owner came after us (a double grant).
  if r[5] ~= ARGV[1] and tonumber(ARGV[2]) > 0 and tonumber(r[6] or '0') > tonumber(ARGV[2]) then
    return {'progress'}
  end
end
local fp = ARGV[3]
if r[1] and fp == '' then fp = r[2] end
redis.call('HSET', KEYS[1], 'state', 'p', 'owner', ARGV[1], 'fence', ARGV[2], 'fp', fp)
redis.call('HDEL', KEYS[1], 'kind', 'result')
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {'claimed'}
`)

// completeScript stores the result, if the caller still owns the record.
// It may be sent again after a failure whose first attempt landed: a
// record this owner already completed answers 1 again.
//
//	KEYS[1] record; ARGV[1] owner, ARGV[2] kind, ARGV[3] result, ARGV[4] retention ms
//	reply: 1 stored (now, or by an earlier attempt of the same owner),
//	       0 not the owner (taken over), -1 no record (expired, or lost)
var completeScript = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'state', 'owner')
if not r[1] then return -1 end
if r[2] ~= ARGV[1] then return 0 end
if r[1] == 'c' then return 1 end
redis.call('HSET', KEYS[1], 'state', 'c', 'kind', ARGV[2], 'result', ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
`)

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
var releaseScript = redis.NewScript(`
local r = redis.call('HMGET', KEYS[1], 'state', 'owner')
if r[1] ~= 'p' or r[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
`)

// consumeScript consumes a one-time token.
//
//	KEYS[1] token key; ARGV[1] how long to remember a used token, ms
//	reply: 1 consumed, 0 unknown (or expired), -1 already used
var consumeScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if v == 'used' then return -1 end
redis.call('SET', KEYS[1], 'used', 'PX', ARGV[1])
return 1
`)
