-- park: store one entry with all its bookkeeping at once; idempotent on the entry id.
-- KEYS[1] entries  hash  id -> payload
-- KEYS[2] index    zset  id -> parked_at
-- KEYS[3] meta     hash  id -> "status|reason|dead_reason|breaker"
-- KEYS[4] counts   hash  "status|breaker" -> number of entries
-- KEYS[5] ready    zset  id -> due_at, of the entry's breaker
-- KEYS[6] dead     zset  id -> time it died (seconds, Redis TIME)
-- KEYS[7] stats    hash  monotonic counters for metrics ("parked|breaker|reason" -> n)
-- KEYS[8] reasons  hash  "status|reason|breaker" -> number of entries, for the entries the
--   "~counted" field covers (absent: none; a score: parked_at <= it; "all": every entry), and
--   "~parks" (parks by this script) and "~base" (the check of reason_counts.lua)
-- ARGV[1] entry id
-- ARGV[2] payload (encoded ParkedTask)
-- ARGV[3] meta text
-- ARGV[4] counts field ("status|breaker")
-- ARGV[5] parked_at (epoch seconds)
-- ARGV[6] due_at (epoch seconds; "+inf": never due, only a replay on demand sends it)
-- ARGV[7] max_entries
-- ARGV[8] status: "parked" (into KEYS[5]) or "dead" (into KEYS[6])
-- ARGV[9] stats field to count this park under
-- ARGV[10] reasons field ("status|reason|breaker")
-- Returns 1 stored, 0 already stored (only the "reparked" counter changed), -1 full (nothing
-- stored).

local id = ARGV[1]
if redis.call('HEXISTS', KEYS[1], id) == 1 then
  -- A write even here: WAIT counts the writes of its own connection, and replication keeps
  -- their order, so a replica that holds this one holds the entry an earlier park stored
  -- (that park's WAIT may never have answered: its worker died, its reply was lost).
  redis.call('HINCRBY', KEYS[7], 'reparked', 1)
  return 0
end
local size = redis.call('HLEN', KEYS[1])
if size >= tonumber(ARGV[7]) then
  return -1
end
local counted = redis.call('HGET', KEYS[8], '~counted')
if not counted and size == 0 then
  -- An empty store: every entry (none) is counted by reason from here on, with no backfill.
  local parked = 0
  local stats = redis.call('HGETALL', KEYS[7])
  for i = 1, #stats, 2 do
    if string.sub(stats[i], 1, 7) == 'parked|' then parked = parked + tonumber(stats[i + 1]) end
  end
  local parks = tonumber(redis.call('HGET', KEYS[8], '~parks') or '0')
  redis.call('HSET', KEYS[8], '~counted', 'all', '~base', parked - parks)
  counted = 'all'
end
redis.call('HSET', KEYS[1], id, ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[5], id)
redis.call('HSET', KEYS[3], id, ARGV[3])
redis.call('HINCRBY', KEYS[4], ARGV[4], 1)
redis.call('HINCRBY', KEYS[7], ARGV[9], 1)
redis.call('HINCRBY', KEYS[8], '~parks', 1)
if counted == 'all' or (counted and tonumber(ARGV[5]) <= tonumber(counted)) then
  redis.call('HINCRBY', KEYS[8], ARGV[10], 1)
end
if ARGV[8] == 'dead' then
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[6], string.format('%d.%06d', t[1], t[2]), id)
else
  redis.call('ZADD', KEYS[5], ARGV[6], id)
end
return 1
