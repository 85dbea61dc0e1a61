-- _common: helpers loaded before each script of this folder (each takes the keys it touches).

-- Take n from a counter field; the field goes when it reaches 0.
local function decrement(hash, field, n)
  if redis.call('HINCRBY', hash, field, -n) <= 0 then redis.call('HDEL', hash, field) end
end

-- Move one entry from status `from` to status `to` in the "status|breaker" counters (counts)
-- and, when the "~counted" field of reasons covers it (see park.lua), in the
-- "status|reason|breaker" ones (reasons); index gives its parked_at.
local function move_status(counts, reasons, index, id, reason, breaker, from, to)
  decrement(counts, from .. '|' .. breaker, 1)
  redis.call('HINCRBY', counts, to .. '|' .. breaker, 1)
  local counted = redis.call('HGET', reasons, '~counted')
  local score = counted and counted ~= 'all' and redis.call('ZSCORE', index, id)
  if counted == 'all' or (score and tonumber(score) <= tonumber(counted)) then
    decrement(reasons, from .. '|' .. reason .. '|' .. breaker, 1)
    redis.call('HINCRBY', reasons, to .. '|' .. reason .. '|' .. breaker, 1)
  end
end
