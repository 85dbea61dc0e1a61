-- acquire, fast path (runs before the shared prelude): a closed breaker without a bulkhead,
-- nothing deferred to record and no delivery questions changes nothing, so one HMGET answers
-- it. Same answer as the full path below (model.acquire); it only skips reading the clock and
-- the other fields.
if ARGV[16] == '0' and KEYS[7] == nil and ARGV[10] == '0' then
  local fast = redis.call('HMGET', KEYS[1], 'state', 'ver', 'consec', 'epoch')
  if not fast[1] or fast[1] == 'closed' or fast[1] == 'forced_closed' then
    local streak = (tonumber(fast[3]) or 0) > 0 and 1 or 0
    local family = {0, ''}
    if ARGV[12] ~= '0' then family = redis.call('HMGET', KEYS[4], 'ver', 'epoch') end
    return {1, 'normal', fast[1] or 'closed', -1, '', 0, '', tonumber(fast[2]) or 0, streak,
            fast[4] or '', tonumber(family[1]) or 0, family[2] or '', 0}
  end
end
