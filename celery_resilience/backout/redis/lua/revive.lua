-- revive: a dead entry becomes parked again, due at ARGV[4], if it is still dead for the
-- reason the caller read (a person's repair, once the entry's bytes read and verify here).
-- KEYS[1] meta      hash  id -> "status|reason|dead_reason|breaker"
-- KEYS[2] counts    hash  "status|breaker" -> number of entries
-- KEYS[3] dead      zset  id -> time it died
-- KEYS[4] ready     zset  id -> due_at, of the entry's breaker
-- KEYS[5] reasons   hash  "status|reason|breaker" -> number of entries, for those "~counted"
--   covers (absent: none; a score: parked_at <= it; "all": every entry; see park.lua)
-- KEYS[6] index     zset  id -> parked_at
-- ARGV[1] entry id
-- ARGV[2] dead reason the caller read (the whole text)
-- ARGV[3] breaker the caller read from meta (KEYS[4] is its ready set)
-- ARGV[4] due_at ("+inf" for an entry only a replay on demand sends)
-- Returns 1 parked again, 0 absent or no longer dead for that reason, -1 its breaker is not
-- ARGV[3] (read again).

local id = ARGV[1]
local meta = redis.call('HGET', KEYS[1], id)
if not meta then
  return 0
end
local status, reason, dead_reason, breaker = string.match(meta, '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
if breaker ~= ARGV[3] then
  return -1
end
if status ~= 'dead' or dead_reason ~= ARGV[2] then
  return 0
end
redis.call('ZREM', KEYS[3], id)
redis.call('ZADD', KEYS[4], ARGV[4], id)
redis.call('HSET', KEYS[1], id, 'parked|' .. reason .. '||' .. breaker)
move_status(KEYS[2], KEYS[5], KEYS[6], id, reason, breaker, 'dead', 'parked')
return 1
