-- unclaim: a delivery that claimed its task id ended without success (a failure, a retry, a
-- park): the claim is given back at once, if it is still this delivery's (its lease may have
-- ended and another delivery claimed the id since). No prelude: it touches no breaker.
-- KEYS[1] dedup marker of the task id, {..}:done:<task id>, or of its dedup key, {..}:dedup:<..>
-- ARGV[1] the claim token of this delivery
-- Returns 1 given back, 0 not this delivery's claim (nothing changed).

local marker = redis.call('GET', KEYS[1])
if marker and string.sub(marker, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
