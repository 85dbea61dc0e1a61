-- rewrite: replace one entry's payload if it is still the one the caller read (key rotation).
-- Only the payload changes: meta, indexes and counters are the same entry's.
-- KEYS[1] entries  hash  id -> payload
-- ARGV[1] entry id;  ARGV[2] payload the caller read;  ARGV[3] payload to store
-- Returns 1 rewritten, 0 absent or changed meanwhile (deleted, parked again).

if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
return 1
