-- claim: lease up to ARGV[2] due entries of one breaker to the drainer.
-- A claimed entry stays in its ready set with its score moved to the lease's end: if the
-- drainer dies before it acks (delete.lua), the entry is simply due again when the lease ends.
-- KEYS[1] ready     zset  id -> due_at (or lease expiry while in flight), of one breaker
-- KEYS[2] inflight  zset  id -> lease expiry (what is out with a drainer right now)
-- KEYS[3] entries   hash  id -> payload
-- KEYS[4] meta      hash  id -> "status|reason|dead_reason|breaker"
-- ARGV[1] now (epoch seconds) or "" to read Redis TIME (a pinned time is for tests only)
-- ARGV[2] most entries to claim;  ARGV[3] lease in seconds
-- Returns {id, payload, meta, ...} for each claimed entry (parked_at is in the payload); an id
-- whose payload or meta is missing (a half-deleted entry) is dropped from the ready set and not
-- returned.

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local lease_end = now + tonumber(ARGV[3])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, id in ipairs(ids) do
  local payload = redis.call('HGET', KEYS[3], id)
  local meta = redis.call('HGET', KEYS[4], id)
  if payload and meta then
    redis.call('ZADD', KEYS[1], lease_end, id)
    redis.call('ZADD', KEYS[2], lease_end, id)
    out[#out + 1] = id
    out[#out + 1] = payload
    out[#out + 1] = meta
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
return out
