-- delete: remove a batch of entries and every trace of them (also the drain's ack).
-- KEYS[1] entries   hash  id -> payload
-- KEYS[2] index     zset  id -> parked_at
-- KEYS[3] meta      hash  id -> "status|reason|dead_reason|breaker"
-- KEYS[4] counts    hash  "status|breaker" -> number of entries
-- KEYS[5] dead      zset  id -> time it died
-- KEYS[6] inflight  zset  id -> lease expiry
-- KEYS[7] reasons   hash  "status|reason|breaker" -> number of entries, for those "~counted"
--   covers (absent: none; a score: parked_at <= it; "all": every entry; see park.lua)
-- KEYS[8..n] ready  zsets id -> due_at, one per breaker named in ARGV
-- ARGV triples, one per entry: id, breaker the caller read from meta, position in KEYS of
--   that breaker's ready key (keys are never built here, so Redis Cluster routes them)
-- Returns one result per entry, in order: 1 deleted, 0 absent, -1 its breaker is not the one
--   given (it was deleted and parked again meanwhile: read meta and call again).
-- Whole-batch commands (HMGET, HDEL and ZREM of many members) keep Redis's time per entry low.

local CHUNK = 500  -- arguments per command, well inside Lua's stack
local function each_chunk(list, fn)
  for i = 1, #list, CHUNK do fn(unpack(list, i, math.min(#list, i + CHUNK - 1))) end
end

local ids, breakers, readies = {}, {}, {}
for i = 1, #ARGV, 3 do
  ids[#ids + 1] = ARGV[i]
  breakers[#breakers + 1] = ARGV[i + 1]
  readies[#readies + 1] = KEYS[tonumber(ARGV[i + 2])]
end
if #ids == 0 then return {} end
local metas = {}
each_chunk(ids, function(...)
  for _, v in ipairs(redis.call('HMGET', KEYS[3], ...)) do metas[#metas + 1] = v end
end)

local counted = redis.call('HGET', KEYS[7], '~counted')
local function by_reason_counted(id)  -- whether the entry is in the reasons counters
  if counted == 'all' then return true end
  if not counted then return false end
  local score = redis.call('ZSCORE', KEYS[2], id)  -- parked_at; none: never counted
  return score ~= false and tonumber(score) <= tonumber(counted)
end
local results, found, traces, counts, by_ready, seen = {}, {}, {}, {}, {}, {}
local reasons = {}
for i, id in ipairs(ids) do
  local meta = metas[i]
  local result = 0
  if seen[id] then
    results[i] = 0  -- named twice: deleted once, absent the second time
  else
    seen[id] = true
    if meta then
      local status, reason, stored = string.match(meta, '^([^|]*)|([^|]*)|[^|]*|(.*)$')
      if stored ~= breakers[i] then
        result = -1
      else
        result = 1
        found[#found + 1] = id
        local field = status .. '|' .. stored
        counts[field] = (counts[field] or 0) + 1
        if by_reason_counted(id) then
          local by_reason = status .. '|' .. reason .. '|' .. stored
          reasons[by_reason] = (reasons[by_reason] or 0) + 1
        end
        local ready = by_ready[readies[i]] or {}
        ready[#ready + 1] = id
        by_ready[readies[i]] = ready
      end
    elseif redis.call('HDEL', KEYS[1], id) == 1 then
      result = 1  -- a payload without meta (half-written by hand) is removed as well
    end
    if result ~= -1 then traces[#traces + 1] = id end
    results[i] = result
  end
end

each_chunk(found, function(...)
  redis.call('HDEL', KEYS[3], ...)
  redis.call('HDEL', KEYS[1], ...)
end)
each_chunk(traces, function(...)
  redis.call('ZREM', KEYS[2], ...)
  redis.call('ZREM', KEYS[5], ...)
  redis.call('ZREM', KEYS[6], ...)
end)
for ready, members in pairs(by_ready) do
  each_chunk(members, function(...) redis.call('ZREM', ready, ...) end)
end
for field, n in pairs(counts) do
  if redis.call('HINCRBY', KEYS[4], field, -n) <= 0 then redis.call('HDEL', KEYS[4], field) end
end
for field, n in pairs(reasons) do
  if redis.call('HINCRBY', KEYS[7], field, -n) <= 0 then redis.call('HDEL', KEYS[7], field) end
end
return results
