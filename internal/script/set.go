package script

// AcquireSet places several locks under one token in one atomic step: every
// key or none. Each key is judged as Acquire (not fair, the delayed-restart
// rule off) judges it alone: free, or held under ARGV[1] (a resent request:
// its TTL raised to ARGV[2], never shortened), or held by an earlier
// attempt "<base>.<m>" of the same base as ARGV[1] "<base>.<n>", m < n
// (taken over) — granted; held under any other token — refused. Only if
// every key is granted does anything get written, each key exactly as
// Acquire writes it, with its own fence counter (the same rules: a grant
// increments it, a counter created anew starts from the server's clock in
// microseconds, a refresh of our own key replies the counter as it is,
// or the clock where there is none, and writes nothing; the counter's TTL
// raised to ARGV[4] ms after a grant, never shortened; "0": left as it
// is). TestAcquireSetJudgesEachKeyAsAcquire holds the two scripts to the
// same answers.
//
//	KEYS[1..n] lock keys, KEYS[n+1..2n] their fence counter keys
//	(FenceKey; the lock keys again without fencing)
//	ARGV[1] token, ARGV[2] ttl in ms, ARGV[3] mode (NoFence, IncrFence),
//	ARGV[4] fence counter TTL in ms ("0": none)
//	reply: {1, f1, ..., fn} on a grant (each fi as Acquire's reply for key
//	i: its fence, 0 with NoFence); {0, i, r} when key i is the first held
//	by another token, r being what Acquire would reply for it (a refusal:
//	IsTaken, Remaining)
var AcquireSet = newScript(-1, `
local n = #KEYS / 2
local mb, mn = string.match(ARGV[1], '^([%w_-]+)%.(%d+)$')
local fresh = {}
for i = 1, n do
  local held = redis.call('GET', KEYS[i])
  if held == false then
    fresh[i] = true
  elseif held == ARGV[1] then
    fresh[i] = false
  else
    -- An earlier attempt of the same acquisition: ours to take over.
    local hb, hn = string.match(held, '^([%w_-]+)%.(%d+)$')
    if hb ~= nil and hb == mb and tonumber(hn) < tonumber(mn) then
      fresh[i] = true
    else
      local left = redis.call('PTTL', KEYS[i])
      if left < 0 then
        return {0, i, -1}
      end
      return {0, i, -3 - left}
    end
  end
end
local out = {1}
local keep = tonumber(ARGV[4])
for i = 1, n do
  local f = 0
  if fresh[i] then
    redis.call('SET', KEYS[i], ARGV[1], 'PX', ARGV[2])
  elseif redis.call('PTTL', KEYS[i]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
  end
  if ARGV[3] ~= '0' then
    local fk = KEYS[n + i]
    if fresh[i] then
      f = redis.call('INCR', fk)
      if f == 1 then
        local t = redis.call('TIME')
        f = tonumber(t[1]) * 1000000 + tonumber(t[2])
        redis.call('SET', fk, string.format('%d', f), 'KEEPTTL')
      end
      if keep > 0 and redis.call('PTTL', fk) < keep then
        redis.call('PEXPIRE', fk, keep)
      end
    else
      local c = redis.call('GET', fk)
      if c then
        f = tonumber(c)
      else
        local t = redis.call('TIME')
        f = tonumber(t[1]) * 1000000 + tonumber(t[2])
      end
    end
  end
  out[i + 1] = f
end
return out
`)

// AcquireSetArgs returns AcquireSet's command line for keys (lock keys
// that passed Check, in the order to be taken) under token: fenceKeys
// holds their FenceKeys, or is nil without fencing. ttl and fenceTTL are
// in ms (fenceTTL as FenceTTL returns it).
func AcquireSetArgs(keys, fenceKeys []string, token string, ttl int64, fenceTTL any) []any {
	n := len(keys)
	line := make([]any, 0, 3+2*n+4)
	line = append(line, "evalsha", AcquireSet.sha, 2*n)
	for _, k := range keys {
		line = append(line, k)
	}
	mode := any(NoFence)
	if fenceKeys != nil {
		mode = IncrFence
		for _, fk := range fenceKeys {
			line = append(line, fk)
		}
	} else {
		for _, k := range keys {
			line = append(line, k)
		}
	}
	return append(line, token, ttl, mode, fenceTTL)
}
