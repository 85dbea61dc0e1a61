-- force: an operator's order (model.force): hold open, hold closed, or reset.
-- KEYS[1..3], ARGV[1..14]: see _common.lua
-- ARGV[15] action "open" | "closed" | "reset"
-- ARGV[16] the maintenance window an "open" starts ("": none), ARGV[17] its end in microseconds
--          (0: not by itself). Every order drops the window held before (see hold).
-- The bulkhead's slots are left alone: their calls are still in flight.
-- Returns {state, transition this call made or "", version of the view, streak 0|1,
--          epoch of the hash ("" while it does not exist)}.
-- Counters (*_total) survive a reset.

local action = ARGV[15]
local transition = ''
if action == 'reset' then
  reset()
  transition = 'reset'
else
  local target = (action == 'open') and 'forced_open' or 'forced_closed'
  if state() ~= target then
    redis.call('DEL', PROBES_KEY)
    put('ho_succ', 0); put('state', target)
    transition = target
  end
end
if action == 'open' then hold(ARGV[16], tonumber(ARGV[17])) else hold('', 0) end
save()
return {state(), transition, num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
