-- backfill: count by reason the next ARGV[1] entries that the reasons counters do not cover yet.
-- A store written before these counters (or whose counters reason_counts.lua found wrong) has
-- entries no counter holds. The counters cover exactly the entries whose parked_at is at most
-- "~counted" (every entry once it is "all"); each writing script keeps that true for the entry
-- it changes, and each call here moves "~counted" forward over entries it counts as they are
-- now, in one atomic step: an entry parked, deleted or marked dead meanwhile is counted once,
-- by whichever script reaches it first in its current state.
-- KEYS[1] index    zset  id -> parked_at (the order of the walk)
-- KEYS[2] meta     hash  id -> "status|reason|dead_reason|breaker"
-- KEYS[3] reasons  hash  "status|reason|breaker" -> n; "~counted", "~parks", "~base"
-- KEYS[4] stats    hash  monotonic counters ("parked|breaker|reason" -> parks ever)
-- ARGV[1] most entries to count in this call (more only when they share one parked_at)
-- ARGV[2] "reset": forget the counters first and start again; "": go on where the last call ended
-- Returns {entries counted by this call, 1 if every entry is counted now else 0}.

if ARGV[2] == 'reset' then redis.call('DEL', KEYS[3]) end
local counted = redis.call('HGET', KEYS[3], '~counted')
if counted == 'all' then return {0, 1} end
local low = '-inf'
if counted then
  low = '(' .. counted
else
  -- The first call: parks from here on by another release would leave "~parks" behind the
  -- stats' parks (reason_counts.lua compares them).
  local parked = 0
  local stats = redis.call('HGETALL', KEYS[4])
  for i = 1, #stats, 2 do
    if string.sub(stats[i], 1, 7) == 'parked|' then parked = parked + tonumber(stats[i + 1]) end
  end
  local parks = tonumber(redis.call('HGET', KEYS[3], '~parks') or '0')
  redis.call('HSET', KEYS[3], '~base', parked - parks)
end
local limit = tonumber(ARGV[1])
local page = redis.call('ZRANGEBYSCORE', KEYS[1], low, '+inf', 'WITHSCORES', 'LIMIT', 0, limit)
local ids, upto, done = {}, nil, #page < 2 * limit
if done then
  for i = 1, #page, 2 do ids[#ids + 1] = page[i] end
else
  -- Entries that share the page's last parked_at may go on past it: stop before them, or,
  -- when the whole page shares one parked_at, take every entry of it.
  local last = page[#page]
  for i = 1, #page, 2 do
    if tonumber(page[i + 1]) < tonumber(last) then
      ids[#ids + 1] = page[i]
      upto = page[i + 1]
    end
  end
  if #ids == 0 then
    ids = redis.call('ZRANGEBYSCORE', KEYS[1], last, last)
    upto = last
  end
end
local adds = {}
for i = 1, #ids, 500 do
  local chunk = redis.call('HMGET', KEYS[2], unpack(ids, i, math.min(#ids, i + 499)))
  for _, meta in ipairs(chunk) do
    if meta then
      local status, reason, breaker = string.match(meta, '^([^|]*)|([^|]*)|[^|]*|(.*)$')
      if status then
        local field = status .. '|' .. reason .. '|' .. breaker
        adds[field] = (adds[field] or 0) + 1
      end
    end
  end
end
for field, n in pairs(adds) do redis.call('HINCRBY', KEYS[3], field, n) end
redis.call('HSET', KEYS[3], '~counted', done and 'all' or upto)
return {#ids, done and 1 or 0}
