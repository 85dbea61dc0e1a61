-- release_permit: give a permit back unjudged (model.release): the call ended in the caller's own
-- error, so nothing is counted, and a probe's slot is freed now rather than when its lease ends.
-- KEYS[1..3], ARGV[1..14]: see _common.lua
-- ARGV[15] kind "normal" | "probe";  ARGV[16] permit id (its bulkhead slot is freed too)
-- ARGV[17] deferred successes of this process, recorded first
-- Returns {state, "", version of the view, streak 0|1, epoch}: a release never makes a
-- transition.

apply_deferred(tonumber(ARGV[17]))
free_slot(ARGV[16])
if ARGV[15] == 'probe' and state() == 'half_open' then
  redis.call('ZREM', PROBES_KEY, ARGV[16])
end
save()
return {state(), '', num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
