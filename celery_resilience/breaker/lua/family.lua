-- family: what a process needs to know of a family of derived breakers (``<base>:<key>``,
-- named at call time) to admit calls on its closed members without a round trip each: the
-- family's version and epoch, and the members that are not closed without a streak. Forgets
-- the members idle past their keys' lifetime first, and counts the successes a process held
-- back (the family's totals: a closed member's own hash is not written for them).
-- KEYS[1] {prefix:breaker:BASE}:family  hash ver, epoch, ntroubled, calls_total, successes_total
-- KEYS[2] {prefix:breaker:BASE}:members zset name -> last write (µs)
-- KEYS[3] {prefix:breaker:BASE}:troubled zset name -> last write (µs)
-- ARGV[1] now in microseconds, or "" for Redis TIME;  ARGV[2] idle_us;  ARGV[3] the most
-- troubled members to list;  ARGV[4] the channel changes are published on;  ARGV[5] successes;
-- ARGV[6] the start of a member's keys ({prefix:breaker:BASE}:key:), ARGV[7] the start of its
-- name (BASE:): what a rebuild reads a member's own state from
-- Returns {ver, epoch, troubled members in all, name...} (names only when all fit in ARGV[3]).

local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local idle_us, most, channel = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local f = redis.call('HMGET', KEYS[1], 'ver', 'epoch', 'ntroubled')
local ver, epoch = tonumber(f[1]) or 0, f[2] or ''

-- ``troubled`` lost members it should hold (a key evicted or restored alone, or the family's
-- hash lost with its count): rebuilt from each member's own state, under a new epoch, so that
-- no process goes on trusting what it learnt from the incomplete set. The members' keys share
-- KEYS[1]'s slot.
if redis.call('ZCARD', KEYS[3]) ~= (tonumber(f[3]) or 0) then
  redis.call('DEL', KEYS[3])
  local members = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
  local listed = 0
  for i = 1, #members, 2 do
    local name = members[i]
    local key = ARGV[6] .. string.sub(name, #ARGV[7] + 1) .. ':state'
    local kept = redis.call('HMGET', key, 'state', 'consec')
    local state = kept[1] or 'closed'
    if (tonumber(kept[2]) or 0) > 0 or (state ~= 'closed' and state ~= 'forced_closed') then
      redis.call('ZADD', KEYS[3], members[i + 1], name)
      listed = listed + 1
    end
  end
  local t = redis.call('TIME')
  epoch = t[1] .. '.' .. t[2]
  ver = redis.call('HINCRBY', KEYS[1], 'ver', 1)
  redis.call('HSET', KEYS[1], 'epoch', epoch, 'ntroubled', listed)
  -- As the members' writes do (_common.lua): the family lives as long as its last write.
  local pinned = redis.call('ZCOUNT', KEYS[2], 4503599627370496, '+inf') > 0
  for _, key in ipairs({KEYS[1], KEYS[3]}) do
    if pinned then
      redis.call('PERSIST', key)
    else
      redis.call('PEXPIRE', key, math.max(1, math.ceil(idle_us / 1000)))
    end
  end
end

-- A member unwritten for idle_us has no keys left: it is closed again (at most 1,000 a call).
local cutoff = string.format('(%d', now - idle_us)
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', cutoff, 'LIMIT', 0, 1000)
for _, name in ipairs(gone) do
  redis.call('ZREM', KEYS[2], name)
  if redis.call('ZREM', KEYS[3], name) == 1 then
    redis.call('HINCRBY', KEYS[1], 'ntroubled', -1)
    ver = redis.call('HINCRBY', KEYS[1], 'ver', 1)
    redis.call('PUBLISH', channel, 'F|' .. ver .. '|' .. epoch .. '|0|closed|0||' .. name)
  end
end

local successes = tonumber(ARGV[5])
if successes > 0 and epoch ~= '' then
  redis.call('HINCRBY', KEYS[1], 'calls_total', successes)
  redis.call('HINCRBY', KEYS[1], 'successes_total', successes)
end
local count = redis.call('ZCARD', KEYS[3])
local out = {ver, epoch, count}
if count <= most then
  for _, name in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do out[#out + 1] = name end
end
return out
