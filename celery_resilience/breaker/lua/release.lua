-- release: give a permit back unjudged (model.release): the call ended in the caller's own
-- error, so nothing is counted, and a probe's slot is freed now rather than when its lease ends.
-- KEYS[1], KEYS[2], ARGV[1..9]: see _common.lua
-- ARGV[10] kind "normal" | "probe";  ARGV[11] permit id
-- ARGV[12] deferred successes of this process, recorded first
-- Returns {state, ""}: a release never makes a transition.

apply_deferred(tonumber(ARGV[12]))
if ARGV[10] == 'probe' and state() == 'half_open' then
  redis.call('ZREM', PROBES_KEY, ARGV[11])
end
save()
return {state(), ''}
