package script

import "github.com/redlease/redlease"

// Proclaim records an election's leader beside its lock key: the term,
// token and value in a hash at LeaderKey, written in one atomic step only
// while the lock key holds the caller's token, so that a deposed leader
// (whose key expired, was released or was taken by the next leader) can
// never overwrite the record of a newer one. The record lives at least as
// long as the lock key: its TTL is raised to the larger of ARGV[4] ms and
// the lock key's PTTL (never shortened). With ARGV[5] = "1" it writes the
// value and publishes the term on the election's channel (LeaderChannel);
// with "0" it only refreshes the TTL of a record the token already owns
// (the leader's own record kept alive while it leads) and publishes
// nothing. PUBLISH runs under redis.pcall: a user whose ACL denies it
// still proclaims; observers then learn of it by polling.
//
//	KEYS[1] lock key, KEYS[2] the record (LeaderKey); ARGV[1] token,
//	ARGV[2] term, ARGV[3] value, ARGV[4] ttl in ms, ARGV[5] "1" to write
//	the value, "0" to refresh the TTL only, ARGV[6] the channel
//	reply: 1 if applied, 0 if the lock key does not hold the token (or,
//	on a refresh, the record is not the token's)
var Proclaim = newScript(2, `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[5] == '1' then
  redis.call('HSET', KEYS[2], 'token', ARGV[1], 'term', ARGV[2], 'value', ARGV[3])
elseif redis.call('HGET', KEYS[2], 'token') ~= ARGV[1] then
  return 0
end
local ttl = math.max(tonumber(ARGV[4]), redis.call('PTTL', KEYS[1]))
if redis.call('PTTL', KEYS[2]) < ttl then
  redis.call('PEXPIRE', KEYS[2], ttl)
end
if ARGV[5] == '1' then
  redis.pcall('PUBLISH', ARGV[6], ARGV[2])
end
return 1
`)

// ProclaimArgs returns the Proclaim command line of a leader holding key
// under token in term: write (its value, published) or refresh.
func ProclaimArgs(key, token string, term uint64, value string, ttlMillis int64, write bool) []any {
	w := "0"
	if write {
		w = "1"
	}
	return Proclaim.Args(key, LeaderKey(key), token, term, value, ttlMillis, w, LeaderChannel(key))
}

// Leader reads, in one atomic step and writing nothing, who leads the
// election of a lock key: the record at LeaderKey counts only when the
// lock key holds the record's token, so that the record of a deposed
// leader is never reported beside a newer holder.
//
//	KEYS[1] lock key, KEYS[2] the record (LeaderKey)
//	reply: {0} no holder; {2} a holder that has not recorded itself (a
//	Campaign between its grant and its record, or a key not taken by an
//	election); {1, term, value} the leader
var Leader = newScript(2, `
local h = redis.call('GET', KEYS[1])
if not h then
  return {0}
end
local r = redis.call('HMGET', KEYS[2], 'token', 'term', 'value')
if r[1] ~= h then
  return {2}
end
return {1, r[2], r[3]}
`)

// LeaderArgs returns the Leader command line of key.
func LeaderArgs(key string) []any {
	return Leader.Args(key, LeaderKey(key))
}

// LeaderKey returns the key of an election's record beside its lock key,
// built like FenceKey, in the key's cluster slot and the reserved
// namespace: "redlease:leader:tag:"+key for a key with a hash tag,
// "redlease:leader:{"+key+"}" otherwise. The key must pass CheckKey.
func LeaderKey(key string) string {
	if hasHashTag(key) {
		return leaderPrefix + "tag:" + key
	}
	return leaderPrefix + "{" + key + "}"
}

// LeaderChannel returns the channel on which Proclaim publishes the terms
// of key's election, built like LeaderKey: "redlease:elect:…".
func LeaderChannel(key string) string {
	if hasHashTag(key) {
		return electPrefix + "tag:" + key
	}
	return electPrefix + "{" + key + "}"
}

const (
	leaderPrefix = redlease.ReservedPrefix + "leader:"
	electPrefix  = redlease.ReservedPrefix + "elect:"
)
