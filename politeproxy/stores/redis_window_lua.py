"""The request window's Lua (``policy.window`` on the Redis server), shared by the claim scripts.

A window is a hash: ``w`` = the bucket width in microseconds, ``<bucket>`` = its count. The functions
mirror ``policy.window``'s ``live``, ``wait``, ``record`` and ``gate``; they read ``num`` and ``fmt`` from
the prelude they are placed in (stores/redis_lua.py), and ``win_put`` writes the live record whole.
"""

from __future__ import annotations

from politeproxy.policy import window

WINDOW_FUNCTIONS = (
    f"""
local WB = {window.BUCKETS}
local WAHEAD = {window.AHEAD}
local WMAXC = {window.MAX_COUNT}
"""
    + """
-- policy.window over a hash: 'w' = the bucket width (us), '<bucket>' = count. win_live: the live buckets
-- (ascending {bucket, count}), whether the record was sane, and the width; as window.live.
local function win_live(key, now, W)
  local w = math.max(1, math.floor(W / WB))
  local raw = redis.call('HGETALL', key)
  local oldw, b, ok = 0, {}, true
  for k = 1, #raw, 2 do
    if raw[k] == 'w' then oldw = num(raw[k + 1])
    else
      local i, c = tonumber(raw[k]), tonumber(raw[k + 1])
      if i == nil or c == nil or i ~= i or c ~= c then ok = false else b[#b + 1] = {i, c} end
    end
  end
  if #b == 0 then return {}, ok, w end
  table.sort(b, function(x, y) return x[1] < y[1] end)
  local lo = math.floor((now - W) / w)
  local hi = math.floor(now / w) + WAHEAD
  local bad, far, prev = not ok, false, nil  -- bad: the buckets themselves are faulty, whatever the width
  for _, e in ipairs(b) do
    if e[2] <= 0 or e[2] > WMAXC or e[1] ~= math.floor(e[1]) then bad = true end
    if e[1] > hi then far = true end
    -- one bucket spelled twice ('16', '16.0'): written back, the second field would overwrite the first
    if prev ~= nil and e[1] == prev then bad = true end
    prev = e[1]
  end
  local sane = oldw == w and not bad and not far
  if sane then
    local kept = {}
    for _, e in ipairs(b) do if e[1] >= lo then kept[#kept + 1] = e end end
    return kept, true, w
  end
  -- another width (the window was changed) or a corrupt record: every count at the newest time it may
  -- stand for, so none leaves the window early; a corrupt record holds for one window at most
  local total = 0
  for _, e in ipairs(b) do total = total + math.min(math.max(0, e[2]), WMAXC) end
  total = math.min(total, WMAXC)
  local ow = oldw
  if not (ow > 0) then ow = w end
  local fin = math.min((b[#b][1] + 1) * ow, (hi + 1) * w)
  local legit = oldw ~= w and oldw > 0 and not bad  -- a reload, not a stray record
  if total <= 0 or fin <= now - W then return {}, legit, w end
  return {{math.max(lo, math.min(hi, math.floor(fin / w))), total}}, legit, w
end
-- window.wait: 0 when one more may go at t, else us from now until it is worth asking again
local function win_wait(b, t, now, W, w, limit)
  local ti = math.floor(t / w)
  if ti > math.floor(now / w) + WAHEAD then return math.max(1, (ti - WAHEAD) * w - now + 1) end
  local lo = math.floor((t - W) / w)
  local total = 0
  for _, e in ipairs(b) do if e[1] >= lo then total = total + e[2] end end
  if total < limit then return 0 end
  for _, e in ipairs(b) do
    if e[1] >= lo then
      total = total - e[2]
      if total < limit then return math.max(1, (e[1] + 1) * w + W - now + 1) end
    end
  end
  return math.max(1, t + W - now)
end
-- window.record, written whole (stale buckets dropped); the key lives a window past its last slot
local function win_put(key, b, t, w, W, now)
  local ti = math.floor(t / w)
  local args, found = {'w', fmt(w)}, false
  for _, e in ipairs(b) do
    local c = e[2]
    if e[1] == ti then c = c + 1; found = true end
    args[#args + 1] = fmt(e[1])
    args[#args + 1] = fmt(c)
  end
  if not found then args[#args + 1] = fmt(ti); args[#args + 1] = '1' end
  redis.call('DEL', key)
  redis.call('HSET', key, unpack(args))
  redis.call('PEXPIRE', key, fmt(math.ceil((W + math.max(0, t - now)) / 1000) + 1000))
end
-- a claim through the window (window.gate): nil when it may go (and it is counted), else {code, wait, at}
local function win_gate(key, slot, now, deadline, W, limit)
  if limit <= 0 then return nil, true end
  local b, ok, w = win_live(key, now, W)
  local later = win_wait(b, slot, now, W, w, limit)
  if later > 0 then
    local at = math.max(slot, now + later)
    if deadline ~= nil and at > deadline then return {2, at - now, at}, ok end
    return {1, at - now, at}, ok
  end
  win_put(key, b, slot, w, W, now)
  return nil, ok
end
"""
)
