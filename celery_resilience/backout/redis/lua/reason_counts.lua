-- reason_counts: the counters by reason, if they can be trusted; read in one atomic step.
-- They can when they cover every entry ("~counted" is "all") and agree with what every release
-- keeps: summed over reasons they equal the "status|breaker" counts, and every park since the
-- backfill began was this release's ("~base" + "~parks" equals the stats' parks). A worker of
-- an older release parks, deletes or marks dead without them: one of the two then differs.
-- KEYS[1] counts   hash  "status|breaker" -> number of entries
-- KEYS[2] reasons  hash  "status|reason|breaker" -> n; "~counted", "~parks", "~base"
-- KEYS[3] stats    hash  monotonic counters ("parked|breaker|reason" -> parks ever)
-- ARGV    none: it reads, and answers what a count needs
-- Returns {"ok", field, n, field, n, ...}, or {"none"} (no counters yet), {"partial"} (a
-- backfill under way) or {"drift"} (complete but wrong: count otherwise, backfill again).

local reasons = redis.call('HGETALL', KEYS[2])
local marks, fields, sums = {}, {'ok'}, {}
for i = 1, #reasons, 2 do
  local field, n = reasons[i], reasons[i + 1]
  if string.sub(field, 1, 1) == '~' then
    marks[field] = n
  else
    local status, breaker = string.match(field, '^([^|]*)|[^|]*|(.*)$')
    local key = status .. '|' .. breaker
    sums[key] = (sums[key] or 0) + tonumber(n)
    fields[#fields + 1] = field
    fields[#fields + 1] = n
  end
end
if not marks['~counted'] then return {'none'} end
if marks['~counted'] ~= 'all' then return {'partial'} end
local counts = redis.call('HGETALL', KEYS[1])
for i = 1, #counts, 2 do
  if (sums[counts[i]] or 0) ~= tonumber(counts[i + 1]) then return {'drift'} end
  sums[counts[i]] = nil
end
for _, n in pairs(sums) do
  if n ~= 0 then return {'drift'} end
end
local parked = 0
local stats = redis.call('HGETALL', KEYS[3])
for i = 1, #stats, 2 do
  if string.sub(stats[i], 1, 7) == 'parked|' then parked = parked + tonumber(stats[i + 1]) end
end
if not marks['~base'] or tonumber(marks['~base']) + tonumber(marks['~parks'] or '0') ~= parked then
  return {'drift'}
end
return fields
