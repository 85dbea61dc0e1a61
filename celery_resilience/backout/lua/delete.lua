-- delete: remove a batch of entries and every trace of them (also the drain's ack).
-- KEYS[1] entries   hash  id -> payload
-- KEYS[2] index     zset  id -> parked_at
-- KEYS[3] meta      hash  id -> "status|reason|dead_reason|breaker"
-- KEYS[4] counts    hash  "status|breaker" -> number of entries
-- KEYS[5] dead      zset  id -> time it died
-- KEYS[6] inflight  zset  id -> lease expiry
-- KEYS[7..n] ready  zsets id -> due_at, one per breaker named in ARGV
-- ARGV triples, one per entry: id, breaker the caller read from meta, position in KEYS of
--   that breaker's ready key (keys are never built here, so Redis Cluster routes them)
-- Returns one result per entry, in order: 1 deleted, 0 absent, -1 its breaker is not the one
--   given (it was deleted and parked again meanwhile: read meta and call again).

local results = {}
for i = 1, #ARGV, 3 do
  local id, breaker, ready = ARGV[i], ARGV[i + 1], KEYS[tonumber(ARGV[i + 2])]
  local result = 0
  local meta = redis.call('HGET', KEYS[3], id)
  if meta then
    local status, stored = string.match(meta, '^([^|]*)|[^|]*|[^|]*|(.*)$')
    if stored ~= breaker then
      result = -1
    else
      local field = status .. '|' .. stored
      if redis.call('HINCRBY', KEYS[4], field, -1) <= 0 then
        redis.call('HDEL', KEYS[4], field)
      end
      redis.call('HDEL', KEYS[3], id)
      redis.call('ZREM', ready, id)
      result = 1
    end
  end
  if result ~= -1 then
    -- A payload without meta (half-written by hand) is removed as well.
    if redis.call('HDEL', KEYS[1], id) == 1 then
      result = 1
    end
    redis.call('ZREM', KEYS[2], id)
    redis.call('ZREM', KEYS[5], id)
    redis.call('ZREM', KEYS[6], id)
  end
  results[#results + 1] = result
end
return results
