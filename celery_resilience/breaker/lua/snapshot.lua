-- snapshot: a read-only view (model.snapshot); writes nothing.
-- KEYS[1..3], ARGV[1..14]: see _common.lua
-- Returns a flat list {field, value, ...}; times in microseconds (0 = never), an open breaker
-- whose timeout has passed reads as half_open.

local s = state()
if s == 'open' and now >= num('open_until') then s = 'half_open' end
local calls, failures, retries = window_counts(true)
local live = 0
if state() == 'half_open' then
  live = redis.call('ZCOUNT', PROBES_KEY, string.format('(%d', now), '+inf')
end
local out = {'state', s, 'consecutive_failures', num('consec'), 'window_calls', calls,
             'window_failures', failures, 'opened_at', num('opened_at'),
             'open_until', num('open_until'), 'trips', num('trips'),
             'half_open_successes', num('ho_succ'), 'probes_in_flight', live,
             'calls_in_flight',
             redis.call('ZCOUNT', CALLS_KEY, string.format('(%d', now), '+inf'),
             'window_retries', retries}
for _, field in ipairs(TOTALS) do
  out[#out + 1] = field; out[#out + 1] = num(field)
end
out[#out + 1] = 'window'; out[#out + 1] = get('window') or ''
return out
