-- acquire: ask for a permit (model.acquire). One call per task delivery.
-- KEYS[1..3], ARGV[1..14]: see _common.lua
-- ARGV[15] permit id (a half-open probe's lease, a bulkhead slot's)
-- ARGV[16] deferred successes: normal successes of this process, recorded before deciding
-- ARGV[17] TTL (seconds) of the redelivery counter; 0: KEYS[7] is there only for KEYS[8]
--          (a first delivery, or a task without acks_late): nothing is counted
-- ARGV[18] deliveries allowed per message (0 = no limit): past it, no permit is taken
-- KEYS[7] optional: redelivery counter of this message, {..}:delivery:<task id>:<retries>:<replays>
--         (given only for a redelivery: deliveries = its count + 1, the first never counted)
-- KEYS[8] optional: dedup marker of this task id, {..}:done:<task id> (deduplicate=True), or of
--         its dedup key, {..}:dedup:<task name>:<key>: "1" the task id succeeded ("1:<task id>"
--         the key succeeded as that id), or "<token>|<lease end, µs>" a delivery runs it now
-- KEYS[9] optional, with a dedup key in KEYS[8]: the task id's own marker, {..}:done:<task id>:
--         "1" (it succeeded under deduplicate=True, before the task had a key) is done too
-- ARGV[19] claim token: with KEYS[8], a permitted delivery claims the task id under it ("" none)
-- ARGV[20] claim lease (µs): the marker names its end; the key expires then too (real time)
-- Returns {allowed 0|1, kind "normal"|"probe"|"" (or "full": turned away because the bulkhead's
--          slots are all taken), state, retry_after_us (-1 = unknown; with skip "claimed":
--          until the claim's lease ends), transition this call made or "", deliveries of this
--          message (0 = not counted), skip: "" | "done" (the task id already succeeded) |
--          "claimed" (another delivery holds its claim) | "redelivered" (past ARGV[18]); when
--          skip is set no permit was taken, version of the view, streak 0|1,
--          epoch of the hash ("" while it does not exist)}

local permit_id = ARGV[15]
apply_deferred(tonumber(ARGV[16]))

local deliveries, max_deliveries = 0, tonumber(ARGV[18])
if KEYS[7] and ARGV[17] ~= '0' then
  deliveries = redis.call('INCR', KEYS[7]) + 1
  redis.call('EXPIRE', KEYS[7], ARGV[17])
end
local marker = KEYS[8] and redis.call('GET', KEYS[8])
local own = KEYS[9] and redis.call('GET', KEYS[9])
if (marker and (marker == '1' or string.sub(marker, 1, 2) == '1:')) or own == '1' then
  save()
  return {0, '', state(), -1, '', deliveries, 'done', num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
end
if max_deliveries > 0 and deliveries > max_deliveries then
  save()
  return {0, '', state(), -1, '', deliveries, 'redelivered', num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
end
if marker then
  local lease_end = tonumber(string.match(marker, '|(%d+)$'))
  if lease_end and lease_end > now then
    save()
    return {0, '', state(), lease_end - now, '', deliveries, 'claimed', num('ver'), streak(),
            epoch(), family(), family_id(), family_mine()}
  end
end

-- A permitted delivery of a task with deduplicate=True claims its task id before its body runs.
local function claim()
  if KEYS[8] and ARGV[19] ~= '' then
    local lease = tonumber(ARGV[20])
    local value = ARGV[19] .. '|' .. string.format('%d', now + lease)
    redis.call('SET', KEYS[8], value, 'PX', math.max(1, math.ceil(lease / 1000)))
  end
end

-- The bulkhead (breaker/bulkhead.py): a slot for this permit, or a rejection of its own.
local function take_slot()
  if lim.max_concurrent_calls <= 0 then return true end
  redis.call('ZREMRANGEBYSCORE', CALLS_KEY, '-inf', now)  -- holders that died or hang
  if redis.call('ZCARD', CALLS_KEY) >= lim.max_concurrent_calls then return false end
  redis.call('ZADD', CALLS_KEY, now + lim.call_lease_us, permit_id)
  sets_written = true
  return true
end
local function full(transition)
  incr('rejected_total', 1); incr('bulkhead_rejected_total', 1); save()
  return {0, 'full', state(), -1, transition, deliveries, '', num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
end

local transition = ''
local s = state()
if s == 'closed' or s == 'forced_closed' then
  if not take_slot() then return full('') end
  claim(); save()
  return {1, 'normal', s, -1, '', deliveries, '', num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
end
if s == 'forced_open' then
  incr('rejected_total', 1); save()
  return {0, '', s, -1, '', deliveries, '', num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
end
if s == 'open' then
  if now < num('open_until') then
    incr('rejected_total', 1); save()
    return {0, '', s, num('open_until') - now, '', deliveries, '', num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
  end
  put('state', 'half_open'); put('ho_succ', 0)
  redis.call('DEL', PROBES_KEY)
  incr('half_opened_total', 1)
  transition = 'half_opened'
end

-- half-open: a probe whose lease ran out belongs to a process that died or hangs.
redis.call('ZREMRANGEBYSCORE', PROBES_KEY, '-inf', now)
if redis.call('ZCARD', PROBES_KEY) < lim.half_open_max_calls then
  if not take_slot() then return full(transition) end
  redis.call('ZADD', PROBES_KEY, now + lim.probe_lease_us, permit_id)
  sets_written = true
  claim(); save()
  return {1, 'probe', 'half_open', -1, transition, deliveries, '', num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
end
incr('rejected_total', 1); save()
return {0, '', 'half_open', lim.open_timeout_us, transition, deliveries, '', num('ver'), streak(), epoch(), family(), family_id(), family_mine()}
