"""The fair turn's Lua (``policy.fairclaim`` on the Redis server), placed in the claim script.

The state is one hash per store prefix: ``v`` = the virtual clock, ``f:<pipeline>`` = its finish tag,
``m:<proxy>:<pipeline>`` = when that proxy's mark expires (server microseconds). The functions mirror
``fairclaim.sane_state``, ``fair_turn`` and ``fair_charge``; tests/unit/stores/test_fair_stores.py runs the
same asks against both. They read ``numok`` and ``fmt`` from the prelude (stores/redis_lua.py).
"""

from __future__ import annotations

from politeproxy.policy import fairclaim
from politeproxy.policy.fairness import MAX_NAME

_US = 1_000_000

FAIR_FUNCTIONS = (
    f"""
local FTTL_MIN = {round(fairclaim.BACKLOG_TTL * _US)}
local FTTL_GAPS = {fairclaim.TTL_GAPS!r}
local FTTL_MAX = {round(fairclaim.TTL_MAX * _US)}
local FRETRY = {round(fairclaim.RETRY * _US)}
local FRETRY_MAX = {round(fairclaim.RETRY_MAX * _US)}
local FMAXM = {fairclaim.MAX_MARKS}
local FMAXB = {fairclaim.MAX_BACKLOG}
local FLEAD = {fairclaim.MAX_LEAD!r}
local FEPS = {fairclaim.EPS!r}
local FMAXNAME = {MAX_NAME}
"""
    + """
local function fair_ttl(gap)
  return math.min(FTTL_MAX, math.max(FTTL_MIN, FTTL_GAPS * gap))
end
local function fair_start(s, p)
  local f = s.f[p]
  if f == nil or f < s.v then return s.v end
  return f
end
-- keep the n entries of t (key -> number) with the largest values
local function fair_bound(t, n)
  local all = {}
  for k, x in pairs(t) do all[#all + 1] = {k, x} end
  if #all <= n then return end
  table.sort(all, function(a, b) return a[2] < b[2] end)
  for i = 1, #all - n do t[all[i][1]] = nil end
end
-- the hash as a state, every value within fairclaim.sane_state's bounds (s.ok: it was sane)
local function fair_load(key, now, gap)
  local raw = redis.call('HGETALL', key)
  local s = {v = 0, f = {}, m = {}, ok = true}
  local vraw, fs, ms = nil, {}, {}
  for i = 1, #raw, 2 do
    local k, x = raw[i], raw[i + 1]
    local kind = string.sub(k, 1, 2)
    if k == 'v' then vraw = x
    elseif kind == 'f:' then fs[#fs + 1] = {string.sub(k, 3), x}
    elseif kind == 'm:' then ms[#ms + 1] = {string.sub(k, 3), x}
    else s.ok = false end
  end
  local v, vok = numok(vraw)
  if not vok or v < 0 then v = 0; s.ok = false end
  s.v = v
  for _, e in ipairs(fs) do
    local f, fok = numok(e[2])
    if fok and #e[1] > 0 and #e[1] <= FMAXNAME and f >= v - FLEAD and f <= v + FLEAD then s.f[e[1]] = f
    else s.ok = false end
  end
  local top = now + fair_ttl(gap) + 1000000
  for _, e in ipairs(ms) do
    local c = string.find(e[1], ':', 1, true)
    local exp, eok = numok(e[2])
    if c == nil or c < 2 or c > 33 or c == #e[1] or #e[1] - c > FMAXNAME or not eok then s.ok = false
    else
      if exp > top then exp = now + fair_ttl(gap); s.ok = false end
      s.m[e[1]] = exp
    end
  end
  return s
end
-- fairclaim.fair_turn: the asking proxy's marks replaced by its backlog; 0 when it is the asker's turn,
-- else the retry (us) and whose turn it is
local function fair_turn(s, proxy, asker, names, now, soon, gap)
  local ttl = fair_ttl(gap)
  local mine = {[asker] = true}
  for i = 1, math.min(#names, FMAXB) do mine[names[i]] = true end
  local pre = proxy .. ':'
  for k, exp in pairs(s.m) do
    if not (exp > now) or (string.sub(k, 1, #pre) == pre and not mine[string.sub(k, #pre + 1)]) then
      s.m[k] = nil
    end
  end
  for p, _ in pairs(mine) do s.m[pre .. p] = now + ttl end
  fair_bound(s.m, FMAXM)
  for p, f in pairs(s.f) do if f <= s.v then s.f[p] = nil end end
  fair_bound(s.f, FMAXM)
  local best = math.huge
  for k, _ in pairs(s.m) do
    local p = string.sub(k, string.find(k, ':', 1, true) + 1)
    local st = fair_start(s, p)
    if st < best then best = st end
  end
  if fair_start(s, asker) <= best + FEPS then return 0, asker end
  -- ties go to the asker's own backlog first (fairclaim.fair_turn says why)
  local turn = nil
  for i = 1, math.min(#names, FMAXB) do
    if turn == nil and fair_start(s, names[i]) <= best + FEPS then turn = names[i] end
  end
  if turn == nil then
    for k, _ in pairs(s.m) do
      local p = string.sub(k, string.find(k, ':', 1, true) + 1)
      if fair_start(s, p) <= best + FEPS and (turn == nil or p < turn) then turn = p end
    end
  end
  return math.min(math.max(FRETRY_MAX, gap), math.max(FRETRY, soon)), turn
end
local function fair_charge(s, asker, w)
  if w == nil or w ~= w or w <= 0 or w > 1e6 then w = 1 end
  local st = fair_start(s, asker)
  s.v = st
  s.f[asker] = st + 1 / w
end
local function fair_save(key, s, gap)
  redis.call('DEL', key)
  local args = {'v', string.format('%.17g', s.v)}
  for p, f in pairs(s.f) do
    args[#args + 1] = 'f:' .. p
    args[#args + 1] = string.format('%.17g', f)
  end
  for k, e in pairs(s.m) do
    args[#args + 1] = 'm:' .. k
    args[#args + 1] = fmt(e)
  end
  redis.call('HSET', key, unpack(args))
  redis.call('PEXPIRE', key, fmt(2 * math.ceil(fair_ttl(gap) / 1000) + 1000))
end
"""
)
