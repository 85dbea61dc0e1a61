-- mark_dead: a parked entry becomes dead: out of its ready set (and in-flight set), into dead;
-- no longer held for another process (it is judged).
-- The payload is left as it is: status lives in meta, so undecodable entries can die too.
-- KEYS[1] meta      hash  id -> "status|reason|dead_reason|breaker"
-- KEYS[2] counts    hash  "status|breaker" -> number of entries
-- KEYS[3] dead      zset  id -> time it died (seconds, Redis TIME)
-- KEYS[4] inflight  zset  id -> lease expiry
-- KEYS[5] ready     zset  id -> due_at, of the entry's breaker
-- KEYS[6] reasons   hash  "status|reason|breaker" -> number of entries, for those "~counted"
--   covers (absent: none; a score: parked_at <= it; "all": every entry; see park.lua)
-- KEYS[7] index     zset  id -> parked_at
-- KEYS[8..] held    zsets id -> parked_at, one per reason an entry is held for
-- ARGV[1] entry id
-- ARGV[2] dead reason (no '|')
-- ARGV[3] breaker the caller read from meta (KEYS[5] is its ready set)
-- Returns 1 marked dead, 0 absent or already dead, -1 its breaker is not ARGV[3] (read again).

local id = ARGV[1]
local meta = redis.call('HGET', KEYS[1], id)
if not meta then
  return 0
end
local status, reason, breaker = string.match(meta, '^([^|]*)|([^|]*)|[^|]*|(.*)$')
if breaker ~= ARGV[3] then
  return -1
end
if status == 'dead' then
  return 0
end
local t = redis.call('TIME')
redis.call('ZREM', KEYS[5], id)
redis.call('ZREM', KEYS[4], id)
for i = 8, #KEYS do redis.call('ZREM', KEYS[i], id) end
redis.call('ZADD', KEYS[3], string.format('%d.%06d', t[1], t[2]), id)
redis.call('HSET', KEYS[1], id, 'dead|' .. reason .. '|' .. ARGV[2] .. '|' .. breaker)
move_status(KEYS[2], KEYS[6], KEYS[7], id, reason, breaker, status, 'dead')
return 1
