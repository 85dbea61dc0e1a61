-- deliver: the delivery questions of a task without a breaker, in one step (no prelude: it
-- touches no breaker). The same answers as acquire.lua gives a task with a breaker.
-- KEYS[1] redelivery counter of this message, {..}:delivery:<task id>:<retries>:<replays>
-- KEYS[2] dedup marker of this task id, {..}:done:<task id>, or of its dedup key,
--         {..}:dedup:<task name>:<key>: "1" the task id succeeded ("1:<task id>" the key
--         succeeded as that id), or "<token>|<lease end, µs>" a delivery runs it now
-- KEYS[3] optional, with a dedup key in KEYS[2]: the task id's own marker, {..}:done:<task id>:
--         "1" (it succeeded under deduplicate=True, before the task had a key) is done too
-- ARGV[1] TTL (seconds) of the redelivery counter; 0: not a redelivery, nothing is counted
-- ARGV[2] "1": look at the marker (deduplicate=True); "0": leave it alone
-- ARGV[3] claim token ("" none);  ARGV[4] claim lease (µs)
-- ARGV[5] deliveries allowed per message (0 = no limit): past it, skip "redelivered"
-- Returns {deliveries (0 = not counted), skip "" | "done" | "claimed" | "redelivered",
--          µs until the claim's lease ends (skip "claimed"), else 0}; the id is claimed only
--          when skip is "".

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local deliveries = 0
if ARGV[1] ~= '0' then
  deliveries = redis.call('INCR', KEYS[1]) + 1
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
local marker = ARGV[2] == '1' and redis.call('GET', KEYS[2])
local own = ARGV[2] == '1' and KEYS[3] and redis.call('GET', KEYS[3])
if (marker and (marker == '1' or string.sub(marker, 1, 2) == '1:')) or own == '1' then
  return {deliveries, 'done', 0}
end
-- Before the claim: a message that kills its worker each time must still be parked.
local max_deliveries = tonumber(ARGV[5])
if max_deliveries > 0 and deliveries > max_deliveries then
  return {deliveries, 'redelivered', 0}
end
if marker then
  local lease_end = tonumber(string.match(marker, '|(%d+)$'))
  if lease_end and lease_end > now then return {deliveries, 'claimed', lease_end - now} end
end
if ARGV[2] == '1' and ARGV[3] ~= '' then
  local lease = tonumber(ARGV[4])
  local value = ARGV[3] .. '|' .. string.format('%d', now + lease)
  redis.call('SET', KEYS[2], value, 'PX', math.max(1, math.ceil(lease / 1000)))
end
return {deliveries, '', 0}
