-- Shared prelude of every breaker script (prepended when the script is loaded).
-- It mirrors celery_resilience/breaker/model.py, the specification (its data types are in
-- types.py: Limits.argv() gives ARGV[2..11], BreakerState the hash); keep them in step.
--
-- KEYS[1]  {prefix:breaker:NAME}:state   hash: state, consec, opened_at, open_until, trips,
--                                         ho_succ, ver, *_total counters, be/bc/bf/br<slot> buckets
--                                         (br: retries the retry budget granted),
--                                         rate_tat (the rate limit's GCRA, rate.lua),
--                                         window, window_until, window_at (see hold below)
-- KEYS[2]  {prefix:breaker:NAME}:probes  zset: probe permit id -> lease expiry (microseconds)
-- KEYS[3]  {prefix:breaker:NAME}:calls   zset: bulkhead slots, permit id -> lease expiry
-- ARGV[1]  now in microseconds, or "" to read Redis TIME (a pinned time is for tests only)
-- ARGV[2..11] limits: failure_threshold, failure_rate_threshold (0 = off), minimum_calls,
--          window_us, open_timeout_us, open_timeout_max_us, half_open_max_calls, probe_lease_us,
--          max_concurrent_calls (0 = no bulkhead), call_lease_us
-- ARGV[12] idle_us: 0 for a declared breaker; for a derived one (named at call time, see
--          below) how long its keys outlive its last write
-- ARGV[13] the breaker's name;  ARGV[14] the channel its changes are published on
-- KEYS[4..6] the family of a derived breaker ``<base>:<key>``, under the base's hash tag (unused
--          for a declared breaker): {prefix:breaker:BASE}:family hash ver, epoch, totals;
--          :members zset name -> last write (µs); :troubled zset, the members whose view is not
--          closed without a streak, name -> last write. ``ver`` counts the members' view
--          changes: a process that heard every one of them since a reply knows that every
--          member outside ``troubled`` is closed (knowledge.py's family knowledge).
-- The view (types.view: the state, and whether a streak of failures runs) is what processes
-- cache between round trips: a script that changes it bumps ``ver`` and publishes
-- "<ver>|<state>|<streak 0|1>|<epoch>|<name>" on ARGV[14], so every process learns of it at
-- once.
-- ``epoch`` names this incarnation of the hash: set (from TIME) by the first script that writes
-- a hash without one, so a hash recreated after DEL / FLUSHDB / eviction / a restore, whose
-- ``ver`` starts again from 0, is told apart from the one a process knew. Every reply ends with
-- it, and a process adopts a published change only for the epoch its own replies taught it.
-- Times are integer microseconds: Lua numbers are doubles, exact below 2^53. Numbers are passed
-- to redis.call as numbers, never concatenated (tostring keeps only 14 digits).

local STATE_KEY, PROBES_KEY, CALLS_KEY = KEYS[1], KEYS[2], KEYS[3]
local FAMILY_KEY, MEMBERS_KEY, TROUBLED_KEY = KEYS[4], KEYS[5], KEYS[6]
local IDLE_US = tonumber(ARGV[12])
local BUCKETS, MAX_GROWTH = 10, 40
local TOTALS = {'opened_total', 'half_opened_total', 'closed_total', 'calls_total',
                'failures_total', 'successes_total', 'rejected_total', 'bulkhead_rejected_total',
                'retry_budget_refused_total', 'rate_limited_total'}

local function read_now()
  if ARGV[1] ~= '' then return tonumber(ARGV[1]) end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local now = read_now()
local lim = {
  failure_threshold = tonumber(ARGV[2]), rate = tonumber(ARGV[3]),
  minimum_calls = tonumber(ARGV[4]), window_us = tonumber(ARGV[5]),
  open_timeout_us = tonumber(ARGV[6]), open_timeout_max_us = tonumber(ARGV[7]),
  half_open_max_calls = tonumber(ARGV[8]), probe_lease_us = tonumber(ARGV[9]),
  max_concurrent_calls = tonumber(ARGV[10]), call_lease_us = tonumber(ARGV[11]),
}
lim.bucket_us = math.max(1, math.floor(lim.window_us / BUCKETS))

-- The stored hash as a table, read lazily: the scalar fields in one HMGET, bucket fields only
-- when the window is touched (a closed breaker's admission reads one field of ~40).
-- put() records which fields to write back.
local h, dirty, loaded = {}, {}, {}
local function load(fields)
  local missing = {}
  for _, field in ipairs(fields) do
    if not loaded[field] then missing[#missing + 1] = field end
  end
  if #missing == 0 then return end
  local values = redis.call('HMGET', STATE_KEY, unpack(missing))
  for i, field in ipairs(missing) do h[field] = values[i] or nil; loaded[field] = true end
end
-- One HMGET for what most scripts touch: the scalars, the totals and this moment's bucket.
local SLOT = math.floor(now / lim.bucket_us) % BUCKETS
load({'state', 'consec', 'opened_at', 'open_until', 'trips', 'ho_succ', 'ver', 'epoch',
      'calls_total', 'failures_total', 'successes_total', 'be' .. SLOT, 'bc' .. SLOT, 'bf' .. SLOT,
      'br' .. SLOT})
local function get(field)
  if not loaded[field] then load({field}) end
  return h[field]
end
local function num(field, default) return tonumber(get(field)) or default or 0 end
local function put(field, value) h[field] = value; dirty[field] = true; loaded[field] = true end
local function incr(field, by) put(field, num(field) + by) end
local function state() return h.state or 'closed' end
local function streak() return num('consec') > 0 and 1 or 0 end
local function view() return state() .. '|' .. streak() end
local function epoch() return h.epoch or '' end
local viewed = view()

-- A derived breaker's family: its version and epoch, read once ({0, ''} for a declared one).
local family_ver, family_epoch
local family_changed = 0  -- 1: this script's change is the family's version ``family_ver``
local function read_family()
  if family_ver then return end
  family_ver, family_epoch = 0, ''
  if IDLE_US > 0 then
    local f = redis.call('HMGET', FAMILY_KEY, 'ver', 'epoch')
    family_ver, family_epoch = tonumber(f[1]) or 0, f[2] or ''
  end
end
local function family() read_family(); return family_ver end
local function family_id() read_family(); return family_epoch end
local function family_mine() return family_changed end

-- A derived breaker's write: its keys and its family's live IDLE_US more; a view change is a
-- change of the family too (published with the family's version, see knowledge.py). A state a
-- person forced is kept until a person ends it: its keys never expire, nor its family's while
-- any member is forced, and its last write is "never" (2^52), so that family.lua never forgets
-- it. ``ntroubled`` counts what ``troubled`` should hold: family.lua rebuilds the set when they
-- differ (a key lost to eviction or a restore). Returns whether the family changed although
-- the member's view did not (it was missing from ``troubled``): that is published too.
local FOREVER = 4503599627370496
local sets_written = false  -- a bulkhead slot or a probe lease was written (acquire.lua)
local function touch_family(changed)
  local ms = math.max(1, math.ceil(IDLE_US / 1000))
  local forced = state() == 'forced_open' or state() == 'forced_closed'
  for _, key in ipairs({STATE_KEY, PROBES_KEY, CALLS_KEY}) do
    if forced then redis.call('PERSIST', key) else redis.call('PEXPIRE', key, ms) end
  end
  read_family()
  if family_epoch == '' then
    local t = redis.call('TIME')
    family_epoch = t[1] .. '.' .. t[2]
    redis.call('HSET', FAMILY_KEY, 'epoch', family_epoch)
  end
  local written = forced and FOREVER or now
  redis.call('ZADD', MEMBERS_KEY, written, ARGV[13])
  local troubled = viewed ~= 'closed|0' and viewed ~= 'forced_closed|0'
  local moved = 0
  if troubled then
    moved = redis.call('ZADD', TROUBLED_KEY, written, ARGV[13])
  elseif changed then
    moved = -redis.call('ZREM', TROUBLED_KEY, ARGV[13])
  end
  if moved ~= 0 then redis.call('HINCRBY', FAMILY_KEY, 'ntroubled', moved) end
  local bumped = moved ~= 0 and not changed
  if changed or bumped then
    family_ver = redis.call('HINCRBY', FAMILY_KEY, 'ver', 1)
    family_changed = 1
  end
  local pinned = redis.call('ZCOUNT', MEMBERS_KEY, FOREVER, '+inf') > 0
  for _, key in ipairs({FAMILY_KEY, MEMBERS_KEY, TROUBLED_KEY}) do
    if pinned then redis.call('PERSIST', key) else redis.call('PEXPIRE', key, ms) end
  end
  return bumped
end

-- Writes what changed, and publishes the view when it changed (once per script: save is last).
-- A hash written without an epoch is a new incarnation (or one older than epochs): it gets one.
local function save()
  local changed = view() ~= viewed
  if changed then put('ver', num('ver') + 1); viewed = view() end
  if next(dirty) ~= nil and not h.epoch then
    local t = redis.call('TIME')
    put('epoch', t[1] .. '.' .. t[2])
  end
  local args = {}
  for field in pairs(dirty) do args[#args + 1] = field; args[#args + 1] = h[field] end
  if #args > 0 then redis.call('HSET', STATE_KEY, unpack(args)) end
  local bumped = false
  if IDLE_US > 0 and (#args > 0 or sets_written) then bumped = touch_family(changed) end
  if changed or bumped then
    local change = num('ver') .. '|' .. view() .. '|' .. epoch() .. '|' .. ARGV[13]
    if IDLE_US > 0 then
      -- "F|<family ver>|<family epoch>|" ahead: what a family view orders changes by.
      change = 'F|' .. family() .. '|' .. family_id() .. '|' .. change
    end
    redis.call('PUBLISH', ARGV[14], change)
  end
end

-- Calls, failures and the retry budget's retries in the window (retries only if asked).
local function window_counts(with_retries)
  local fields = {}  -- built here, not up front: most calls never read the window
  for slot = 0, BUCKETS - 1 do
    fields[#fields + 1] = 'be' .. slot
    fields[#fields + 1] = 'bc' .. slot
    fields[#fields + 1] = 'bf' .. slot
    if with_retries then fields[#fields + 1] = 'br' .. slot end
  end
  load(fields)
  local current = math.floor(now / lim.bucket_us)
  local calls, failures, retries = 0, 0, 0
  for slot = 0, BUCKETS - 1 do
    if num('be' .. slot, -1) > current - BUCKETS then
      calls = calls + num('bc' .. slot)
      failures = failures + num('bf' .. slot)
      if with_retries then retries = retries + num('br' .. slot) end
    end
  end
  return calls, failures, retries
end

-- A bucket's br field is written only by retry.lua (a breaker without a retry budget never has
-- one): a bucket whose epoch moves on drops it.
local function add_to_window(calls, failures, retries)
  local epoch = math.floor(now / lim.bucket_us)
  local slot = epoch % BUCKETS
  load({'be' .. slot, 'bc' .. slot, 'bf' .. slot, 'br' .. slot})
  if num('be' .. slot, -1) ~= epoch then
    put('be' .. slot, epoch); put('bc' .. slot, 0); put('bf' .. slot, 0)
    if get('br' .. slot) then put('br' .. slot, 0) end
  end
  incr('bc' .. slot, calls)
  incr('bf' .. slot, failures)
  if retries and retries > 0 then incr('br' .. slot, retries) end
end

local function clear_counts()
  put('consec', 0); put('ho_succ', 0)
  redis.call('DEL', PROBES_KEY)
  local retry_fields = {}
  for slot = 0, BUCKETS - 1 do retry_fields[#retry_fields + 1] = 'br' .. slot end
  load(retry_fields)
  for slot = 0, BUCKETS - 1 do
    put('be' .. slot, -1); put('bc' .. slot, 0); put('bf' .. slot, 0)
    if get('br' .. slot) then put('br' .. slot, 0) end
  end
end

-- least_us: a failure that said when to come back (Retry-After) keeps the breaker open that long.
local function trip(least_us)
  put('trips', num('trips') + 1)
  local growth = 2 ^ math.min(num('trips') - 1, MAX_GROWTH)
  local timeout = math.max(least_us or 0,
                           math.min(lim.open_timeout_max_us, lim.open_timeout_us * growth))
  clear_counts()
  put('state', 'open'); put('opened_at', now); put('open_until', now + timeout)
  incr('opened_total', 1)
  return 'opened'
end

local function close()
  clear_counts()
  put('state', 'closed'); put('trips', 0); put('opened_at', 0); put('open_until', 0)
  incr('closed_total', 1)
  return 'closed'
end

-- An operator's reset (model.force): a fresh closed breaker, its *_total counters kept.
local function reset()
  clear_counts()
  put('state', 'closed'); put('trips', 0); put('opened_at', 0); put('open_until', 0)
end

-- The maintenance window holding the breaker forced open (model.force, maintenance.py): its id,
-- end (microseconds, 0: not by itself) and when it was set, or none (window ''): dropped by
-- every order of this release but the one that starts it, in that order's own script (the
-- previous release's orders know no hold and leave it: when it was set tells it apart).
local function hold(window, until_us)
  if window ~= '' then
    put('window', window); put('window_until', until_us); put('window_at', now)
  elseif get('window') then
    redis.call('HDEL', STATE_KEY, 'window', 'window_until', 'window_at')
    h.window, h.window_until, h.window_at = nil, nil, nil
  end
end

local function count(calls, failures)
  load({'calls_total', 'failures_total', 'successes_total'})
  incr('calls_total', calls)
  incr('failures_total', failures)
  incr('successes_total', calls - failures)
end

-- Successes of normal permits that a process held back to save round trips: counted, but
-- they end no streak of failures (they may be older than failures recorded meanwhile).
local function apply_deferred(successes)
  if successes > 0 then
    count(successes, 0)
    if state() == 'closed' or state() == 'forced_closed' then
      add_to_window(successes, 0)
    end
  end
end

-- The bulkhead (breaker/bulkhead.py): a call ended, judged or not, so its slot (if any) is free.
-- Calls in flight stay in flight whatever the state does: no transition clears CALLS_KEY.
local function free_slot(permit_id)
  redis.call('ZREM', CALLS_KEY, permit_id)
end
