"""The Lua scripts of the Redis store: each decision is one script, atomic on the server.

They mirror the Python rules exactly: ``CLAIM`` is ``slots.claim`` after ``slots.sane_global`` and
``slots.sane_host``; ``THROTTLE`` is ``backoff.throttle_delay`` plus ``backoff.apply_throttle`` in one
script, so a cancellation can never count a throttle without applying its backoff. The bounds are the
constants of ``policy/slots.py``; tests/unit/stores/test_claim_cases.py runs one table of cases against both.
Times are integer microseconds of the server's ``TIME``.
"""

from __future__ import annotations

from politeproxy.policy import slots
from politeproxy.policy.backoff import FAIL_BLOCK
from politeproxy.stores.redis_fair_lua import FAIR_FUNCTIONS
from politeproxy.stores.redis_window_lua import WINDOW_FUNCTIONS

US = 1_000_000

_CONSTANTS = f"""
local SLACK = {round(slots.SCHEDULE_SLACK * US)}
local GAPS = {slots.SCHEDULE_GAPS!r}
local MAX_CRAWL = {round(slots.MAX_CRAWL_DELAY * US)}
local MAX_ROBOTS = {round(slots.MAX_ROBOTS_TTL * US)}
local MAX_THROTTLES = {slots.MAX_THROTTLES}
local LOOSE_STEP = {round(slots.MAX_DURATION * US)}
local MAX_BACKOFF = {round(slots.MAX_BACKOFF * US)}
local MAX_RECOVERY = {round(slots.MAX_RECOVERY * US)}
local MAX_TAT = {round(slots.MAX_TAT * US)}
local PROBE_LEASE = {round(slots.PROBE_LEASE * US)}
local PROBE_POLL = {round(slots.PROBE_POLL * US)}
local STEPS = {slots.ADAPT_STEPS}
local FAIL_BLOCK = {FAIL_BLOCK}
"""

PRELUDE = (
    _CONSTANTS
    + """
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function fmt(x)
  return string.format('%.0f', x)
end
-- a field that is not a finite number is absent (0): 'nan', '1e400', 'abc' all read as 0
local function num(x)
  local v = tonumber(x)
  if v == nil or v ~= v or v == math.huge or v == -math.huge then return 0 end
  return v
end
-- the same, and whether a present field was a finite number (a stray value is corrupt: logged once)
local function numok(x)
  if not x then return 0, true end
  local v = num(x)
  return v, v ~= 0 or tonumber(x) == 0
end
-- slots.sane_time: a time beyond `ahead` past now is treated as now
local function sane(t, now, ahead)
  if t > now + ahead then return now, false end
  if t < 0 then return 0, true end
  return t, true
end
-- slots.sane_host over the 12 fields below (times and the adaptive interval in us)
local FIELDS = {'next_allowed', 'backoff_until', 'throttles', 'crawl_delay', 'robots_expires', 'blocks',
  'fails', 'probe_until', 'adapt_interval', 'adapt_from', 'adapt_until', 'tat'}
local function sane_host(key, now, gap, step, backoff)
  local r = redis.call('HMGET', key, unpack(FIELDS))
  local h = {}
  local ok = true
  for i = 1, 12 do
    local v, fine = numok(r[i])
    h[i] = v
    ok = ok and fine
  end
  if h[4] < 0 or h[4] > MAX_CRAWL then h[4] = 0; ok = false end
  if h[9] < 0 or h[9] > LOOSE_STEP then h[9] = 0; ok = false end
  for _, i in ipairs({3, 6, 7}) do
    local t = math.min(math.max(0, math.floor(h[i])), MAX_THROTTLES)
    if t ~= h[i] then ok = false end
    h[i] = t
  end
  local hold = backoff
  if h[6] > 0 then hold = math.max(backoff, MAX_BACKOFF) end
  local o = {}
  h[1], o[1] = sane(h[1], now, SLACK + GAPS * gap + math.max(step, h[4], h[9]))
  h[2], o[2] = sane(h[2], now, hold + 1000000)
  h[5], o[3] = sane(h[5], now, MAX_ROBOTS)
  h[8], o[4] = sane(h[8], now, SLACK + GAPS * gap + PROBE_LEASE)
  h[10], o[5] = sane(h[10], now, hold + 1000000)
  h[11], o[6] = sane(h[11], now, hold + 1000000 + MAX_RECOVERY)
  h[12], o[7] = sane(h[12], now, MAX_TAT)
  for i = 1, 7 do ok = ok and o[i] end
  return h, ok
end
local function put_host(key, h)
  local args = {}
  for i = 1, 12 do
    args[2 * i - 1] = FIELDS[i]
    args[2 * i] = fmt(h[i])
  end
  redis.call('HSET', key, unpack(args))
end
local function furthest(h)
  return math.max(h[1], h[2], h[5], h[8], h[11], h[12])
end
-- slots.adaptive_interval
local function adaptive(h, t, base)
  local e = h[9]
  if e <= base or t >= h[11] then return base end
  if t < h[10] then return e end
  local span = h[11] - h[10]
  if span <= 0 then return base end
  local k = math.min(STEPS, math.floor((t - h[10]) / (span / STEPS)))
  return e - (e - base) * k / STEPS
end
-- keep a key key_ttl past the furthest future time it holds (bounded: a stray value cannot break PEXPIRE)
local function keep(key, now, ttl_ms, far)
  local ahead = math.min(math.max(0, far - now), MAX_ROBOTS + LOOSE_STEP)
  redis.call('PEXPIRE', key, fmt(ttl_ms + math.ceil(ahead / 1000)))
end
local function host_furthest(key)
  local h = redis.call('HMGET', key, 'next_allowed', 'backoff_until', 'robots_expires', 'probe_until',
    'adapt_until', 'tat')
  return math.max(num(h[1]), num(h[2]), num(h[3]), num(h[4]), num(h[5]), num(h[6]))
end
"""
    + WINDOW_FUNCTIONS
)

# The claim's prelude also carries the fair turn (the other scripts do not need it).
_CLAIM_PRELUDE = PRELUDE + FAIR_FUNCTIONS

# KEYS: global, host, window (the service's request window for this egress), fair (the pipelines' turns).
# ARGV: gap_us, interval_us, max_wait_us ('' = none), key_ttl_ms, max_backoff_us, not_before_us (the slot
# is no earlier than now + this), last_next_us (the next this proxy wrote last), window_us, window_limit
# (0 = no window), then the fair ask: proxy ('' = none), pipeline, weight, the proxy's backlog names...
# Returns {outcome (0 granted, 1 host not ready, 2 too late, 3 not this pipeline's turn), wait_us, at_us,
# corrupt (1 global, 2 host, 4 window, 8 fair), probe (1: granted as the probe after a block), window (1:
# the window had no room), turn (3: whose turn it is)}.
CLAIM = (
    _CLAIM_PRELUDE
    + """
local now = now_us()
local gap = tonumber(ARGV[1])
local interval = tonumber(ARGV[2])
local deadline = nil
if ARGV[3] ~= '' then deadline = now + tonumber(ARGV[3]) end
local ttl_ms = tonumber(ARGV[4])

local corrupt = 0
local graw, gfine = numok(redis.call('HGET', KEYS[1], 'next'))
local gnext, gok = sane(graw, now, SLACK + GAPS * gap)
gok = gok and gfine
if not gok then
  -- slots.sane_global: now + one gap, or this proxy's last written next when later and sane
  gnext = now + gap
  local last = tonumber(ARGV[7])
  if last > now and last <= now + SLACK + GAPS * gap then gnext = math.max(gnext, last) end
  corrupt = 1
  redis.call('HSET', KEYS[1], 'next', fmt(gnext))  -- treated as now, and written so (as the file store)
  keep(KEYS[1], now, ttl_ms, gnext)
end
local h, hok = sane_host(KEYS[2], now, gap, interval, tonumber(ARGV[5]))
if not hok then
  corrupt = corrupt + 2
  put_host(KEYS[2], h)  -- the sane form replaces the corrupt record (as the file store does)
  keep(KEYS[2], now, ttl_ms, furthest(h))
end

local slot = now
if gap > 0 then slot = math.max(now, gnext) end
slot = math.max(slot, now + tonumber(ARGV[6]))
local ready = math.max(h[1], h[2])
if ready > slot then
  if deadline ~= nil and ready > deadline then return {2, ready - now, ready, corrupt} end
  return {1, ready - now, ready, corrupt}
end
if h[6] > 0 and h[8] > now then  -- blocked, and the probe is out: look again soon
  local poll = math.min(h[8] - now, PROBE_POLL)
  return {1, poll, now + poll, corrupt}
end
if deadline ~= nil and slot > deadline then return {2, slot - now, slot, corrupt} end
local fair = nil
if ARGV[10] ~= nil and ARGV[10] ~= '' and gap > 0 then  -- the fair turn (policy.fairclaim.fair_gate)
  fair = fair_load(KEYS[4], now, gap)
  if not fair.ok then corrupt = corrupt + 8 end
  local names = {}
  for i = 13, #ARGV do names[#names + 1] = ARGV[i] end
  local fwait, turn = fair_turn(fair, ARGV[10], ARGV[11], names, now, slot - now - gap, gap)
  if fwait > 0 then
    fair_save(KEYS[4], fair, gap)
    return {3, fwait, now + fwait, corrupt, 0, 0, turn}
  end
end
local full, wok = win_gate(KEYS[3], slot, now, deadline, tonumber(ARGV[8]), tonumber(ARGV[9]))
if not wok then corrupt = corrupt + 4 end
if full ~= nil then
  if fair ~= nil then fair_save(KEYS[4], fair, gap) end
  return {full[1], full[2], full[3], corrupt, 0, 1}
end
if fair ~= nil then
  fair_charge(fair, ARGV[11], tonumber(ARGV[12]))
  fair_save(KEYS[4], fair, gap)
end

local new_next = gnext
if gap > 0 then new_next = slot + gap end
if gap > 0 then redis.call('HSET', KEYS[1], 'next', fmt(new_next)) end
redis.call('HINCRBY', KEYS[1], 'count', 1)
keep(KEYS[1], now, ttl_ms, new_next)

local raised = 0
local ibase = math.max(interval, gap)
if h[9] > ibase and slot < h[11] then raised = adaptive(h, slot, ibase) end
local step = math.max(interval, h[4], raised)
if step > 0 then redis.call('HSET', KEYS[2], 'next_allowed', fmt(slot + step)) end
if h[6] > 0 then redis.call('HSET', KEYS[2], 'probe_until', fmt(slot + PROBE_LEASE)) end  -- the probe
if step > 0 or h[6] > 0 then keep(KEYS[2], now, ttl_ms, host_furthest(KEYS[2])) end
local probe = 0
if h[6] > 0 then probe = 1 end
return {0, slot - now, slot, corrupt, probe, 0}
"""
)

# KEYS: host. ARGV: retry_after_s ('' = none), base_s, factor, cap_s, jitter, rand, key_ttl_ms,
# max_backoff_us, kind (backoff.Kind), configured interval_us, block_hold_s, block_hold_cap_s, adaptive
# (0/1), adaptive_floor_s, adaptive_recovery_s. backoff.answer_delay and backoff.apply_answer in one step:
# counts the throttle and pushes backoff_until out together. Returns {delay_us, corrupt (2 host), block}.
THROTTLE = (
    PRELUDE
    + """
local now = now_us()
local base, factor, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local jitter, rand = tonumber(ARGV[5]), tonumber(ARGV[6])
local kind, bhold, bcap = tonumber(ARGV[9]), tonumber(ARGV[11]), tonumber(ARGV[12])
local h, ok = sane_host(KEYS[1], now, 0, LOOSE_STEP, tonumber(ARGV[8]))
local ra = nil
if ARGV[1] ~= '' then ra = tonumber(ARGV[1]) end
local block = kind == 1 or (kind == 2 and h[7] + 1 >= FAIL_BLOCK)
local delay
if block then
  local hold = math.min(bcap, bhold * math.pow(2, math.min(h[6], 64)))
  delay = hold
  if ra ~= nil and ra > hold then delay = math.min(ra, math.max(cap, bcap)) end
elseif ra ~= nil then
  delay = math.min(cap, ra)
else
  local raw = base * math.pow(factor, math.min(h[3], 64))
  delay = math.min(cap, raw * (1.0 + jitter * rand))
end
local delay_us = math.floor(delay * 1000000 + 0.5)
local untl = math.max(h[2], now + delay_us)
if ARGV[13] == '1' then  -- backoff.raised_interval, from the state before this answer
  local ibase = tonumber(ARGV[10])
  local floor_us, cap_us = tonumber(ARGV[14]) * 1000000, cap * 1000000
  local cur = math.max(ibase, adaptive(h, now, ibase))
  h[9] = math.max(floor_us, math.min(math.max(cap_us, floor_us), 2 * cur))
  h[10] = untl
  h[11] = untl + tonumber(ARGV[15]) * 1000000
end
h[2] = untl
h[3] = h[3] + 1
if block then
  h[6] = h[6] + 1
  h[7] = 0
elseif kind == 2 then
  h[7] = h[7] + 1
else
  h[7] = 0
end
h[8] = 0
put_host(KEYS[1], h)
keep(KEYS[1], now, tonumber(ARGV[7]), furthest(h))
local corrupt = 0
if not ok then corrupt = 2 end
local b = 0
if block then b = 1 end
return {delay_us, corrupt, b}
"""
)

# KEYS: host, ceiling (the record holding the GCRA state: the host's service, or the host itself), window
# (as CLAIM's). ARGV: rate_us (0 = no ceiling), burst, max_wait_us ('' = none), key_ttl_ms,
# max_backoff_us, hold ('1': the backoff, block and probe hold the read; '0': exempt.respect_backoff =
# false), window_us, window_limit (0 = no window).
# slots.exempt_claim: a GCRA slot, held by a backoff, a block or a probe out, then the window.
# Returns {outcome, wait_us, corrupt (2 host, 4 window), probe, window (1: the window had no room)}.
EXEMPT = (
    PRELUDE
    + """
local now = now_us()
local ttl_ms = tonumber(ARGV[4])
local h, ok = sane_host(KEYS[1], now, 0, LOOSE_STEP, tonumber(ARGV[5]))
local corrupt = 0
if not ok then
  corrupt = 2
  put_host(KEYS[1], h)
  keep(KEYS[1], now, ttl_ms, furthest(h))
end
local c = h
if KEYS[2] ~= KEYS[1] then
  local cok
  c, cok = sane_host(KEYS[2], now, 0, LOOSE_STEP, tonumber(ARGV[5]))
  if not cok then
    corrupt = 2
    put_host(KEYS[2], c)
    keep(KEYS[2], now, ttl_ms, furthest(c))
  end
end
local deadline = nil
if ARGV[3] ~= '' then deadline = now + tonumber(ARGV[3]) end
local hold = ARGV[6] == '1'
if hold and h[2] > now then
  if deadline ~= nil and h[2] > deadline then return {2, h[2] - now, corrupt} end
  return {1, h[2] - now, corrupt}
end
if hold and h[6] > 0 and h[8] > now then return {1, math.min(h[8] - now, PROBE_POLL), corrupt} end
local rate, burst = tonumber(ARGV[1]), math.max(1, tonumber(ARGV[2]))
local slot = now
local tat = c[12]
if rate > 0 then
  tat = math.max(c[12], now)
  slot = math.max(now, tat + rate - burst * rate)
  tat = tat + rate
end
if deadline ~= nil and slot > deadline then return {2, slot - now, corrupt} end
local full, wok = win_gate(KEYS[3], slot, now, deadline, tonumber(ARGV[7]), tonumber(ARGV[8]))
if not wok then corrupt = corrupt + 4 end
if full ~= nil then return {full[1], full[2], corrupt, 0, 1} end
if rate > 0 then
  redis.call('HSET', KEYS[2], 'tat', fmt(tat))
  keep(KEYS[2], now, ttl_ms, host_furthest(KEYS[2]))
end
local probe = hold and h[6] > 0
if probe then
  redis.call('HSET', KEYS[1], 'probe_until', fmt(slot + PROBE_LEASE))
  keep(KEYS[1], now, ttl_ms, host_furthest(KEYS[1]))
end
if probe then return {0, slot - now, corrupt, 1, 0} end
return {0, slot - now, corrupt, 0, 0}
"""
)

# KEYS: host. ARGV: seconds_us, key_ttl_ms, max_backoff_us. A mirrored backoff: backoff_until is pushed
# out to at least now + seconds, the throttle count is left alone. Returns the backoff left in us.
HOLD = (
    PRELUDE
    + """
local now = now_us()
local h, ok = sane_host(KEYS[1], now, 0, LOOSE_STEP, tonumber(ARGV[3]))
h[2] = math.max(h[2], now + tonumber(ARGV[1]))
put_host(KEYS[1], h)
keep(KEYS[1], now, tonumber(ARGV[2]), furthest(h))
return h[2] - now
"""
)

# KEYS: host. backoff.apply_success: resets the counts, and ends a block whose hold is over, without
# creating a key (a key without a TTL would live forever).
SUCCEEDED = (
    PRELUDE
    + """
local r = redis.call('HMGET', KEYS[1], 'throttles', 'fails', 'blocks', 'backoff_until')
if num(r[1]) ~= 0 or num(r[2]) ~= 0 then redis.call('HSET', KEYS[1], 'throttles', 0, 'fails', 0) end
if num(r[3]) ~= 0 and num(r[4]) <= now_us() then
  redis.call('HSET', KEYS[1], 'blocks', 0, 'probe_until', 0)
end
return 1
"""
)
