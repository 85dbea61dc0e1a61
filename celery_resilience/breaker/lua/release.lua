-- release: give a permit back unjudged (model.release): the call ended in the caller's own
-- error, so nothing is counted, and a probe's slot is freed now rather than when its lease ends.
-- KEYS[1], KEYS[2], ARGV[1..11]: see _common.lua
-- ARGV[12] kind "normal" | "probe";  ARGV[13] permit id
-- ARGV[14] deferred successes of this process, recorded first
-- Returns {state, "", version of the view, streak 0|1, epoch}: a release never makes a
-- transition.

apply_deferred(tonumber(ARGV[14]))
if ARGV[12] == 'probe' and state() == 'half_open' then
  redis.call('ZREM', PROBES_KEY, ARGV[13])
end
save()
return {state(), '', num('ver'), streak(), epoch()}
