-- delete: remove a batch of entries and every trace of them; an ack (the drain's, a replay's)
-- also remembers in the same step what it published (a copy written back later is then
-- refused) and forgets what it remembered whose time is up. A plain delete names no key of
-- that memory, so a Redis user without write access to it may still delete.
-- KEYS[1] entries   hash  id -> payload
-- KEYS[2] index     zset  id -> parked_at
-- KEYS[3] meta      hash  id -> "status|reason|dead_reason|breaker"
-- KEYS[4] counts    hash  "status|breaker" -> number of entries
-- KEYS[5] dead      zset  id -> time it died
-- KEYS[6] inflight  zset  id -> lease expiry
-- KEYS[7] reasons   hash  "status|reason|breaker" -> number of entries, for those "~counted"
--   covers (absent: none; a score: parked_at <= it; "all": every entry; see park.lua)
-- KEYS[8] held:unknown_key, KEYS[9] held:newer_format  zsets id -> parked_at (give_back.lua)
-- an ack only: KEYS[10] consumed  hash  id -> signed parked_at of an entry published
--              KEYS[11] consumed_until  zset  id -> when it is forgotten (its lifetime's end)
-- then the ready zsets (id -> due_at), one per breaker named in ARGV
-- ARGV[1] c, the number of entries to remember (0 and up: an ack), or -1 (a plain delete)
-- ARGV[2] f, the most remembered entries whose time is up (Redis TIME) to forget (an ack)
-- ARGV[3..3c+2] triples, one per entry to remember: id, parked_at, until (the latest of
--   what is remembered of an id is kept)
-- ARGV then triples, one per entry: id, breaker the caller read from meta, position in KEYS of
--   that breaker's ready key (keys are never built here, so Redis Cluster routes them)
-- Returns the number of remembered entries forgotten, then one result per entry, in order: 1
--   deleted, 0 absent, -1 its breaker is not the one given (it was deleted and parked again
--   meanwhile: read meta and call again).
-- Whole-batch commands (HMGET, HDEL and ZREM of many members) keep Redis's time per entry low.

local CHUNK = 500  -- arguments per command, well inside Lua's stack
local function each_chunk(list, fn)
  for i = 1, #list, CHUNK do fn(unpack(list, i, math.min(#list, i + CHUNK - 1))) end
end

local remembered = tonumber(ARGV[1])
local first = 3 + 3 * math.max(remembered, 0)
local forgotten = 0
if remembered >= 0 then
  for i = 3, first - 1, 3 do
    local id, parked, til = ARGV[i], ARGV[i + 1], ARGV[i + 2]
    local known = redis.call('HGET', KEYS[10], id)
    if not known or tonumber(known) < tonumber(parked) then
      redis.call('HSET', KEYS[10], id, parked)
    end
    local kept = redis.call('ZSCORE', KEYS[11], id)
    if not kept or tonumber(kept) < tonumber(til) then redis.call('ZADD', KEYS[11], til, id) end
  end
  local t = redis.call('TIME')
  local now = string.format('%d.%06d', t[1], t[2])
  local old = redis.call('ZRANGEBYSCORE', KEYS[11], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
  each_chunk(old, function(...)
    redis.call('HDEL', KEYS[10], ...)
    redis.call('ZREM', KEYS[11], ...)
  end)
  forgotten = #old
end

local ids, breakers, readies = {}, {}, {}
for i = first, #ARGV, 3 do
  ids[#ids + 1] = ARGV[i]
  breakers[#breakers + 1] = ARGV[i + 1]
  readies[#readies + 1] = KEYS[tonumber(ARGV[i + 2])]
end
if #ids == 0 then return {forgotten} end
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
local results, found, traces, counts, by_ready, seen = {forgotten}, {}, {}, {}, {}, {}
local reasons = {}
for i, id in ipairs(ids) do
  local meta = metas[i]
  local result = 0
  if seen[id] then
    results[i + 1] = 0  -- named twice: deleted once, absent the second time
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
    results[i + 1] = result
  end
end

each_chunk(found, function(...)
  redis.call('HDEL', KEYS[3], ...)
  redis.call('HDEL', KEYS[1], ...)
end)
each_chunk(traces, function(...)
  for _, key in ipairs({KEYS[2], KEYS[5], KEYS[6], KEYS[8], KEYS[9]}) do
    redis.call('ZREM', key, ...)
  end
end)
for ready, members in pairs(by_ready) do
  each_chunk(members, function(...) redis.call('ZREM', ready, ...) end)
end
for field, n in pairs(counts) do decrement(KEYS[4], field, n) end
for field, n in pairs(reasons) do decrement(KEYS[7], field, n) end
return results
