-- force: an operator's order (model.force): hold open, hold closed, or reset.
-- KEYS[1..3], ARGV[1..14]: see _common.lua
-- ARGV[15] action "open" | "closed" | "reset"
-- The bulkhead's slots are left alone: their calls are still in flight.
-- Returns {state, transition this call made or "", version of the view, streak 0|1,
--          epoch of the hash ("" while it does not exist)}.
-- Counters (*_total) survive a reset.

local action = ARGV[15]
if action == 'reset' then
  clear_counts()
  put('state', 'closed'); put('trips', 0); put('opened_at', 0); put('open_until', 0)
  save()
  return {'closed', 'reset', num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
end
local target = (action == 'open') and 'forced_open' or 'forced_closed'
if state() == target then return {target, '', num('ver'), streak(), epoch(), family(), family_id(), family_mine()} end
redis.call('DEL', PROBES_KEY)
put('ho_succ', 0); put('state', target)
save()
return {target, target, num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
