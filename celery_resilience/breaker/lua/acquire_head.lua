-- acquire, fast path (runs before the shared prelude): a closed breaker, nothing deferred to
-- record and no delivery questions changes nothing, so one HGET answers it. Same answer as
-- the full path below (model.acquire); it only skips reading the clock and the other fields.
if ARGV[11] == '0' and KEYS[3] == nil then
  local fast = redis.call('HGET', KEYS[1], 'state')
  if not fast or fast == 'closed' or fast == 'forced_closed' then
    return {1, 'normal', fast or 'closed', -1, '', 0, ''}
  end
end
