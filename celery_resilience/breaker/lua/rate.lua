-- rate: lease one batch of calls from the breaker's fleet-wide rate limit (model.lease_rate).
-- KEYS[1..3], ARGV[1..14]: see _common.lua
-- ARGV[15] span_us: the time the fleet's rate takes to earn one batch (batch / rate)
-- ARGV[16] burst_us: how far ahead of now the rate may be spent (the bucket's size, as time)
-- ARGV[17] refused: calls the process turned away alone since its last lease (counted)
-- A GCRA: the hash's rate_tat is the moment up to which the fleet's rate is spent. A batch is
-- granted when it fits within burst_us of now; a refusal leaves rate_tat as it is. Time is
-- Redis's (TIME in the prelude): every process spends one clock.
-- Returns {0 granted | microseconds until the batch would be granted, epoch}.

local span, burst, refused = tonumber(ARGV[15]), tonumber(ARGV[16]), tonumber(ARGV[17])
local tat = math.max(num('rate_tat'), now)
local wait = tat + span - burst - now
if wait <= 0 then
  put('rate_tat', tat + span)
  wait = 0
end
if refused > 0 then incr('rate_limited_total', refused) end
save()
return {wait, epoch()}
