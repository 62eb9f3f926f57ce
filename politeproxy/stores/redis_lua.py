"""The Lua scripts of the Redis store: each decision is one script, atomic on the server.

They mirror the Python rules exactly: ``CLAIM`` is ``slots.claim`` after ``slots.sane_global`` and
``slots.sane_host``; ``THROTTLE`` is ``backoff.throttle_delay`` plus ``backoff.apply_throttle`` in one
script, so a cancellation can never count a throttle without applying its backoff. The bounds are the
constants of ``policy/slots.py``; tests/test_claim_cases.py runs one table of cases against both.
Times are integer microseconds of the server's ``TIME``.
"""

from __future__ import annotations

from politeproxy.policy import slots

US = 1_000_000

_CONSTANTS = f"""
local SLACK = {round(slots.SCHEDULE_SLACK * US)}
local GAPS = {slots.SCHEDULE_GAPS!r}
local MAX_CRAWL = {round(slots.MAX_CRAWL_DELAY * US)}
local MAX_ROBOTS = {round(slots.MAX_ROBOTS_TTL * US)}
local MAX_THROTTLES = {slots.MAX_THROTTLES}
local LOOSE_STEP = {round(slots.MAX_DURATION * US)}
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
-- slots.sane_host over {next_allowed, backoff_until, throttles, crawl_delay, robots_expires}
local function sane_host(key, now, gap, step, backoff)
  local r = redis.call('HMGET', key, 'next_allowed', 'backoff_until', 'throttles', 'crawl_delay',
    'robots_expires')
  local h = {}
  local ok = true
  for i = 1, 5 do
    local v, fine = numok(r[i])
    h[i] = v
    ok = ok and fine
  end
  if h[4] < 0 or h[4] > MAX_CRAWL then h[4] = 0; ok = false end
  local o1, o2, o3
  h[1], o1 = sane(h[1], now, SLACK + GAPS * gap + math.max(step, h[4]))
  h[2], o2 = sane(h[2], now, backoff + 1000000)
  h[5], o3 = sane(h[5], now, MAX_ROBOTS)
  local t = math.min(math.max(0, math.floor(h[3])), MAX_THROTTLES)
  if t ~= h[3] then ok = false end
  h[3] = t
  return h, ok and o1 and o2 and o3
end
local function put_host(key, h)
  redis.call('HSET', key, 'next_allowed', fmt(h[1]), 'backoff_until', fmt(h[2]), 'throttles', fmt(h[3]),
    'crawl_delay', fmt(h[4]), 'robots_expires', fmt(h[5]))
end
-- keep a key key_ttl past the furthest future time it holds (bounded: a stray value cannot break PEXPIRE)
local function keep(key, now, ttl_ms, furthest)
  local ahead = math.min(math.max(0, furthest - now), MAX_ROBOTS + LOOSE_STEP)
  redis.call('PEXPIRE', key, fmt(ttl_ms + math.ceil(ahead / 1000)))
end
local function host_furthest(key)
  local h = redis.call('HMGET', key, 'next_allowed', 'backoff_until', 'robots_expires')
  return math.max(num(h[1]), num(h[2]), num(h[3]))
end
"""
)

# KEYS: global, host. ARGV: gap_us, interval_us, max_wait_us ('' = none), key_ttl_ms, max_backoff_us,
# not_before_us (the slot is no earlier than now + this), last_next_us (the next this proxy wrote last).
# Returns {outcome (0 granted, 1 host not ready, 2 too late), wait_us, at_us, corrupt (1 global, 2 host)}.
CLAIM = (
    PRELUDE
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
  keep(KEYS[2], now, ttl_ms, math.max(h[1], h[2], h[5]))
end

local slot = now
if gap > 0 then slot = math.max(now, gnext) end
slot = math.max(slot, now + tonumber(ARGV[6]))
local ready = math.max(h[1], h[2])
if ready > slot then
  if deadline ~= nil and ready > deadline then return {2, ready - now, ready, corrupt} end
  return {1, ready - now, ready, corrupt}
end
if deadline ~= nil and slot > deadline then return {2, slot - now, slot, corrupt} end

local new_next = gnext
if gap > 0 then new_next = slot + gap end
if gap > 0 then redis.call('HSET', KEYS[1], 'next', fmt(new_next)) end
redis.call('HINCRBY', KEYS[1], 'count', 1)
keep(KEYS[1], now, ttl_ms, new_next)

local step = math.max(interval, h[4])
if step > 0 then
  redis.call('HSET', KEYS[2], 'next_allowed', fmt(slot + step))
  keep(KEYS[2], now, ttl_ms, host_furthest(KEYS[2]))
end
return {0, slot - now, slot, corrupt}
"""
)

# KEYS: host. ARGV: retry_after_s ('' = none), base_s, factor, cap_s, jitter, rand, key_ttl_ms,
# max_backoff_us. backoff.throttle_delay and backoff.apply_throttle in one step: counts the throttle and
# pushes backoff_until out together. Returns {delay_us, corrupt (2 host)}.
THROTTLE = (
    PRELUDE
    + """
local now = now_us()
local base, factor, cap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local jitter, rand = tonumber(ARGV[5]), tonumber(ARGV[6])
local h, ok = sane_host(KEYS[1], now, 0, LOOSE_STEP, math.min(tonumber(ARGV[8]), cap * 1000000))
local delay
if ARGV[1] ~= '' then
  delay = math.min(cap, tonumber(ARGV[1]))
else
  local raw = base * math.pow(factor, math.min(h[3], 64))
  delay = math.min(cap, raw * (1.0 + jitter * rand))
end
local delay_us = math.floor(delay * 1000000 + 0.5)
h[2] = math.max(h[2], now + delay_us)
h[3] = h[3] + 1
put_host(KEYS[1], h)
keep(KEYS[1], now, tonumber(ARGV[7]), math.max(h[1], h[2], h[5]))
local corrupt = 0
if not ok then corrupt = 2 end
return {delay_us, corrupt}
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
keep(KEYS[1], now, tonumber(ARGV[2]), math.max(h[1], h[2], h[5]))
return h[2] - now
"""
)

# KEYS: host. Resets the throttle count without creating a key (a key without a TTL would live forever).
SUCCEEDED = """
local n = tonumber(redis.call('HGET', KEYS[1], 'throttles')) or 0
if n ~= 0 then redis.call('HSET', KEYS[1], 'throttles', 0) end
return 1
"""

# KEYS: host. ARGV: crawl_delay_us, robots_ttl_us, key_ttl_ms.
SET_CRAWL_DELAY = (
    PRELUDE
    + """
local now = now_us()
redis.call('HSET', KEYS[1], 'crawl_delay', fmt(tonumber(ARGV[1])),
  'robots_expires', fmt(now + tonumber(ARGV[2])))
keep(KEYS[1], now, tonumber(ARGV[3]), host_furthest(KEYS[1]))
return 1
"""
)

# KEYS: host. ARGV: max_backoff_us. Returns {now, next_allowed, backoff_until, throttles, crawl_delay,
# robots_expires, corrupt}, every field within its (loose) bound: a view never returns a stray value.
HOST_VIEW = (
    PRELUDE
    + """
local now = now_us()
local h, ok = sane_host(KEYS[1], now, 0, LOOSE_STEP, tonumber(ARGV[1]))
local corrupt = 0
if not ok then corrupt = 2 end
return {now, h[1], h[2], h[3], h[4], h[5], corrupt}
"""
)
