-- give_back: give claimed entries back before their lease ends: the publish failed, or their
-- queue is full (this process read them: no longer held), or this process can't read them
-- (held, for one that can: a key it lacks, a newer release's format).
-- KEYS[1] ready     zset  id -> due_at, of one breaker
-- KEYS[2] inflight  zset  id -> lease expiry
-- KEYS[3] index     zset  id -> parked_at
-- KEYS[4..] held    zsets id -> parked_at, one per reason an entry is held for
-- ARGV[1] when they are due again (epoch seconds)
-- ARGV[2] position in KEYS of the held zset they go into ("0": none, they read here)
-- ARGV[3..n] entry ids
-- Returns the number of entries given back (ids acked or deleted meanwhile are skipped).

local into = tonumber(ARGV[2])
local released = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[2], id) == 1 then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[1], id)
    for k = 4, #KEYS do
      if k ~= into then redis.call('ZREM', KEYS[k], id) end
    end
    local parked = into > 0 and redis.call('ZSCORE', KEYS[3], id)
    if parked then redis.call('ZADD', KEYS[into], parked, id) end
    released = released + 1
  end
end
return released
