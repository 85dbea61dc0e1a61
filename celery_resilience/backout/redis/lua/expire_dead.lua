-- expire_dead: remove up to ARGV[2] entries dead for longer than ARGV[1] seconds (Redis TIME).
-- Dead entries are in no ready or in-flight set, so no per-breaker key is needed.
-- KEYS[1] entries  hash  id -> payload
-- KEYS[2] index    zset  id -> parked_at
-- KEYS[3] meta     hash  id -> "status|reason|dead_reason|breaker"
-- KEYS[4] counts   hash  "status|breaker" -> number of entries
-- KEYS[5] dead     zset  id -> time it died
-- KEYS[6] reasons  hash  "status|reason|breaker" -> number of entries, for those "~counted"
--   covers (absent: none; a score: parked_at <= it; "all": every entry; see park.lua)
-- ARGV[1] dead_ttl (seconds)
-- ARGV[2] most entries to remove in this call
-- Returns the number removed (call again while it equals ARGV[2]).

local t = redis.call('TIME')
local cutoff = tonumber(t[1]) + tonumber(t[2]) / 1000000 - tonumber(ARGV[1])
local counted = redis.call('HGET', KEYS[6], '~counted')
local ids = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', string.format('%.6f', cutoff),
  'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do
  local meta = redis.call('HGET', KEYS[3], id)
  if meta then
    local status, reason, breaker = string.match(meta, '^([^|]*)|([^|]*)|[^|]*|(.*)$')
    local field = status .. '|' .. breaker
    if redis.call('HINCRBY', KEYS[4], field, -1) <= 0 then
      redis.call('HDEL', KEYS[4], field)
    end
    local score = counted and counted ~= 'all' and redis.call('ZSCORE', KEYS[2], id)
    if counted == 'all' or (score and tonumber(score) <= tonumber(counted)) then
      field = status .. '|' .. reason .. '|' .. breaker
      if redis.call('HINCRBY', KEYS[6], field, -1) <= 0 then
        redis.call('HDEL', KEYS[6], field)
      end
    end
    redis.call('HDEL', KEYS[3], id)
  end
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[5], id)
end
return #ids
