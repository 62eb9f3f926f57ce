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
local WLATE = {round(window.LATE * 1_000_000)}
"""
    + """
-- window.WindowRule.reach: a slot counts for the requests up to the window plus LATE after it
local function win_reach(W)
  return W + math.min(WLATE, W)
end
-- policy.window over a hash: 'w' = the bucket width (us), '<bucket>' = count. win_live: the live buckets
-- (ascending {bucket, count}), whether the record was sane, the width, and whether it was folded (not
-- sane, or of another width: to be written back); as window.live.
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
  if #b == 0 then return {}, ok, w, not ok end
  table.sort(b, function(x, y) return x[1] < y[1] end)
  local lo = math.floor((now - win_reach(W)) / w)
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
    return kept, true, w, false
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
  if total <= 0 or fin <= now - win_reach(W) then return {}, legit, w, true end
  return {{math.max(lo, math.min(hi, math.floor(fin / w))), total}}, legit, w, true
end
-- window.wait: 0 when one more may go at t, else us from now until it is worth asking again
local function win_wait(b, t, now, W, w, limit)
  local ti = math.floor(t / w)
  if ti > math.floor(now / w) + WAHEAD then return math.max(1, (ti - WAHEAD) * w - now + 1) end
  local R = win_reach(W)
  local lo = math.floor((t - R) / w)
  local total = 0
  for _, e in ipairs(b) do if e[1] >= lo then total = total + e[2] end end
  if total < limit then return 0 end
  for _, e in ipairs(b) do
    if e[1] >= lo then
      total = total - e[2]
      if total < limit then return math.max(1, (e[1] + 1) * w + R - now + 1) end
    end
  end
  return math.max(1, t + R - now)
end
-- window.record, written whole (stale buckets dropped; add = false: as it is, a stray record bounded);
-- the key lives a reach past its last slot
local function win_put(key, b, t, w, W, now, add)
  local ti = math.floor(t / w)
  local args, found, last = {'w', fmt(w)}, not add, now
  for _, e in ipairs(b) do
    local c = e[2]
    if add and e[1] == ti then c = c + 1; found = true end
    args[#args + 1] = fmt(e[1])
    args[#args + 1] = fmt(c)
    last = math.max(last, (e[1] + 1) * w)
  end
  if not found then args[#args + 1] = fmt(ti); args[#args + 1] = '1'; last = math.max(last, t) end
  redis.call('DEL', key)
  redis.call('HSET', key, unpack(args))
  redis.call('PEXPIRE', key, fmt(math.ceil((win_reach(W) + last - now) / 1000) + 1000))
end
-- a claim through the window (window.gate): nil when it may go (and it is counted), else {code, wait, at}
local function win_gate(key, slot, now, deadline, W, limit)
  if limit <= 0 then return nil, true end
  local b, ok, w, folded = win_live(key, now, W)
  local later = win_wait(b, slot, now, W, w, limit)
  if later > 0 then
    -- a stray or re-widthed record is written back bounded even now: left as it was, it would be bounded
    -- anew against each later now, a bucket further every time, and hold the service for good
    if folded then win_put(key, b, slot, w, W, now, false) end
    local at = math.max(slot, now + later)
    if deadline ~= nil and at > deadline then return {2, at - now, at}, ok end
    return {1, at - now, at}, ok
  end
  win_put(key, b, slot, w, W, now, true)
  return nil, ok
end
"""
)
