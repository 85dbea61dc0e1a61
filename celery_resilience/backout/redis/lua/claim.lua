-- claim: lease up to ARGV[2] due entries of one breaker to the drainer.
-- A claimed entry stays in its ready set with its score moved to the lease's end: if the
-- drainer dies before it acks (delete.lua), the entry is simply due again when the lease ends.
-- KEYS[1] ready     zset  id -> due_at (or lease expiry while in flight), of one breaker
-- KEYS[2] inflight  zset  id -> lease expiry (what is out with a drainer right now)
-- KEYS[3] entries   hash  id -> payload
-- KEYS[4] meta      hash  id -> "status|reason|dead_reason|breaker"
-- ARGV[1] now (epoch seconds) or "" to read Redis TIME (a pinned time is for tests only)
-- ARGV[2] most entries to claim;  ARGV[3] lease in seconds
-- Returns {"<id>\n<meta>", payload, ...} for each claimed entry (parked_at is in the payload;
-- two strings an entry, not three: the reply is parsed in the drainer); an id whose payload or
-- meta is missing (a half-deleted entry) is dropped from the ready set and not returned.
-- Whole-batch commands (HMGET, ZADD of many members) keep Redis's time per entry low.

local CHUNK = 500  -- arguments per command, well inside Lua's stack
local function each_chunk(list, step, fn)
  for i = 1, #list, CHUNK * step do
    fn(unpack(list, i, math.min(#list, i + CHUNK * step - 1)))
  end
end

local now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
local lease_end = now + tonumber(ARGV[3])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
if #ids == 0 then return {} end
local payloads, metas = {}, {}
each_chunk(ids, 1, function(...)
  for _, v in ipairs(redis.call('HMGET', KEYS[3], ...)) do payloads[#payloads + 1] = v end
  for _, v in ipairs(redis.call('HMGET', KEYS[4], ...)) do metas[#metas + 1] = v end
end)
local leased, gone, out = {}, {}, {}
for i, id in ipairs(ids) do
  if payloads[i] and metas[i] then
    leased[#leased + 1] = lease_end
    leased[#leased + 1] = id
    out[#out + 1] = id .. '\n' .. metas[i]
    out[#out + 1] = payloads[i]
  else
    gone[#gone + 1] = id
  end
end
each_chunk(leased, 2, function(...)
  redis.call('ZADD', KEYS[1], ...)
  redis.call('ZADD', KEYS[2], ...)
end)
each_chunk(gone, 1, function(...) redis.call('ZREM', KEYS[1], ...) end)
return out
