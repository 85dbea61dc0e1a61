-- retry: take retries from the breaker's retry budget (model.spend_retries).
-- KEYS[1..3], ARGV[1..14]: see _common.lua
-- ARGV[15] ratio: the share of the window's first attempts that retries may add
-- ARGV[16] floor: retries a second granted whatever the first attempts (min_retries_per_second)
-- ARGV[17] retries wanted (one for a task's retry, a batch for the drain)
-- First attempts are the window's calls less the retries granted: calls reach the window when
-- recorded (successes up to a flush late), so they are never overcounted.
-- Only a closed breaker (or one forced closed) spends: elsewhere the admission turns a retry
-- away or makes it a probe, so all are granted and none counted.
-- Returns {granted, state, version of the view, streak 0|1, epoch}.

local ratio, floor, wanted = tonumber(ARGV[15]), tonumber(ARGV[16]), tonumber(ARGV[17])
local granted = wanted
local s = state()
if (s == 'closed' or s == 'forced_closed') and wanted > 0 then
  local calls, _, retries = window_counts(true)
  local allowed = ratio * math.max(0, calls - retries) + floor * (lim.window_us / 1000000)
  granted = math.min(wanted, math.max(0, math.floor(allowed - retries)))
  if granted > 0 then add_to_window(0, 0, granted) end
  if wanted > granted then incr('retry_budget_refused_total', wanted - granted) end
  save()
end
return {granted, state(), num('ver'), streak(), epoch()}
