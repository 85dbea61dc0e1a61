-- record: the outcome of a permitted call (model.record).
-- KEYS[1..3], ARGV[1..14]: see _common.lua
-- ARGV[15] kind "normal" | "probe" | "lost" (a probe's if the permit id holds a probe lease);  ARGV[16] permit id;  ARGV[17] "1" success | "0" failure
-- ARGV[18] deferred successes of this process, recorded first
-- ARGV[19] optional: least time (µs) a trip by this failure keeps the breaker open (the failure's
--          Retry-After); absent or 0: the open timeout alone
-- The permit's bulkhead slot, if it held one, is freed whatever the state.
-- Returns {state, transition this call made or "", version of the view, streak 0|1,
--          epoch of the hash ("" while it does not exist)}: exactly
-- one caller sees each "opened".

local kind, permit_id, success = ARGV[15], ARGV[16], ARGV[17] == '1'
local failures = success and 0 or 1
local least_open_us = tonumber(ARGV[19] or '0') or 0
apply_deferred(tonumber(ARGV[18]))
count(1, failures)
free_slot(permit_id)

if kind == 'lost' then
  kind = redis.call('ZSCORE', PROBES_KEY, permit_id) and 'probe' or 'normal'
end
local transition = ''
local s = state()
if kind == 'probe' then
  if s == 'half_open' and redis.call('ZREM', PROBES_KEY, permit_id) == 1 then
    if not success then
      transition = trip(least_open_us)
    else
      incr('ho_succ', 1)
      if num('ho_succ') >= lim.half_open_max_calls then transition = close() end
    end
  end
elseif s == 'closed' or s == 'forced_closed' then
  add_to_window(1, failures)
  if success then
    put('consec', 0)
  else
    incr('consec', 1)
    if s == 'closed' then
      local tripped = num('consec') >= lim.failure_threshold
      if not tripped and lim.rate > 0 then
        local calls, fails = window_counts()
        tripped = calls >= lim.minimum_calls and fails / calls >= lim.rate
      end
      if tripped then transition = trip(least_open_us) end
    end
  end
end
save()
return {state(), transition, num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
