"""The Redis store's scripts that read a record or edit it by hand: a host's view, a window's count, a
Crawl-delay, a release. The prelude (``redis_lua.PRELUDE``) gives them its bounds and helpers."""

from __future__ import annotations

from politeproxy.stores.redis_lua import PRELUDE

# KEYS: host. A release (politeproxy release): the hold, the counts and the raised interval cleared,
# without creating a key (a key without a TTL would live forever).
RELEASE = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'backoff_until', 0, 'throttles', 0, 'blocks', 0, 'fails', 0, 'probe_until', 0,
    'adapt_interval', 0, 'adapt_from', 0, 'adapt_until', 0)
end
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

# KEYS: window. ARGV: window_us. The requests the window holds now (reserved slots included).
WINDOW_USED = (
    PRELUDE
    + """
local now = now_us()
local W = tonumber(ARGV[1])
local b, ok, w = win_live(KEYS[1], now, W)
local lo = math.floor((now - W) / w)
local n = 0
for _, e in ipairs(b) do if e[1] >= lo then n = n + e[2] end end
return n
"""
)

# KEYS: host. ARGV: max_backoff_us. Returns {now, the 12 fields of sane_host, corrupt}, every field within
# its (loose) bound: a view never returns a stray value.
HOST_VIEW = (
    PRELUDE
    + """
local now = now_us()
local h, ok = sane_host(KEYS[1], now, 0, LOOSE_STEP, tonumber(ARGV[1]))
local corrupt = 0
if not ok then corrupt = 2 end
return {now, h[1], h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9], h[10], h[11], h[12], corrupt}
"""
)

# KEYS: window. ARGV: window_us, then pairs of (bucket end - now in us, count): window.merged(add=True) on
# the server's clock, the record written back whole (win_put). Returns the buckets it holds.
ADD_WINDOW = (
    PRELUDE
    + """
local now = now_us()
local W = tonumber(ARGV[1])
local b, ok, w = win_live(KEYS[1], now, W)
local lo = math.floor((now - win_reach(W)) / w)
local hi = math.floor(now / w) + WAHEAD
local counts = {}
for _, e in ipairs(b) do counts[e[1]] = e[2] end
for k = 2, #ARGV - 1, 2 do
  local rel, c = tonumber(ARGV[k]), tonumber(ARGV[k + 1])
  if rel ~= nil and c ~= nil and rel == rel and c == c and c > 0 then
    local i = math.min(hi, math.ceil((now + rel) / w - 0.001) - 1)
    if i >= lo then counts[i] = math.min(WMAXC, (counts[i] or 0) + math.floor(c)) end
  end
end
local out = {}
for i, c in pairs(counts) do out[#out + 1] = {i, c} end
table.sort(out, function(x, y) return x[1] < y[1] end)
if #out > 0 then win_put(KEYS[1], out, now, w, W, now, false) end
return #out
"""
)
