-- end_window: a maintenance window is over (model.end_window): the breaker is reset only if
-- that very window still holds it forced open and has ended, in one step with dropping it. An
-- order given since (a person's lever, a new window) dropped it: then nothing changes.
-- KEYS[1..3], ARGV[1..14]: see _common.lua
-- ARGV[15] the window's id; "" for a window recorded without one (by the previous release,
--          whose orders know no hold): reset if forced open and no window set after that
--          record holds it (its end was read from the record by the caller).
-- ARGV[16] with ARGV[15] "": when that record was written (microseconds).
-- Returns {state, "reset" if it ended the window else "", version of the view, streak 0|1,
--          epoch of the hash}.

local window = ARGV[15]
local held, ends = get('window') or '', num('window_until')
local ours
if window == '' then
  ours = held == '' or num('window_at') < (tonumber(ARGV[16]) or 0)
else
  ours = held == window and ends > 0 and ends <= now
end
if state() ~= 'forced_open' or not ours then
  return {state(), '', num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
end
reset()
hold('', 0)
save()
return {state(), 'reset', num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
