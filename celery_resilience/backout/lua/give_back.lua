-- give_back: give claimed entries back before their lease ends (the publish failed).
-- KEYS[1] ready     zset  id -> due_at, of one breaker
-- KEYS[2] inflight  zset  id -> lease expiry
-- ARGV[1] when they are due again (epoch seconds);  ARGV[2..n] entry ids
-- Returns the number of entries given back (ids acked or deleted meanwhile are skipped).

local released = 0
for i = 2, #ARGV do
  if redis.call('ZREM', KEYS[2], ARGV[i]) == 1 then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[1], ARGV[i])
    released = released + 1
  end
end
return released
