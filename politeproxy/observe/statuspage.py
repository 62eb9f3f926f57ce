"""The status page at ``GET /`` on the admin port: one self-contained HTML document that fetches ``status``
(the JSON document of ``politeproxy.observe.status``) every few seconds and draws it, with a chart of achieved
against configured rate over the last 15 minutes in inline SVG.

Nothing is fetched but ``status`` from the page's own origin: no CDN, no web font, no image. The
Content-Security-Policy says so to the browser too: only the two inline blocks below (by their hashes) run
or style, and ``connect-src 'self'``. Names from clients (pipelines, hosts) reach the page only through
``textContent`` and SVG attributes, never as markup.
"""

from __future__ import annotations

import base64
import hashlib

REFRESH_SECONDS = 2  # the page asks for a new document this long after the last answer

STYLE = """
:root { --fg:#1d2430; --muted:#5d6878; --line:#d8dee8; --bg:#f6f8fb; --card:#fff;
  --ok:#1f8a4c; --warn:#b7791f; --bad:#c53030; --ach:#2b6cb0; --conf:#9b2c2c; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.4 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg);
  background: var(--bg); }
header { display: flex; gap: 16px; align-items: baseline; padding: 12px 20px; background: var(--card);
  border-bottom: 1px solid var(--line); flex-wrap: wrap; }
h1 { font-size: 18px; margin: 0; }
h2 { font-size: 15px; margin: 20px 0 8px; }
main { padding: 0 20px 24px; max-width: 1200px; }
.muted { color: var(--muted); }
#conn.down { color: var(--bad); font-weight: 600; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin-top: 14px; }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: 8px 12px;
  min-width: 140px; }
.card .k { font-size: 12px; color: var(--muted); }
.card .v { font-size: 18px; font-variant-numeric: tabular-nums; }
table { border-collapse: collapse; width: 100%; background: var(--card); border: 1px solid var(--line); }
th, td { text-align: left; padding: 5px 10px; border-bottom: 1px solid var(--line); white-space: nowrap; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
th { font-size: 12px; color: var(--muted); font-weight: 600; }
.state-ok { color: var(--ok); } .state-backing-off { color: var(--warn); font-weight: 600; }
.state-blocked { color: var(--bad); font-weight: 700; } .state-unknown { color: var(--muted); }
.degraded { color: var(--bad); font-weight: 700; }
#chart { width: 100%; height: 240px; background: var(--card); border: 1px solid var(--line);
  border-radius: 6px; }
#chart .grid { stroke: var(--line); stroke-width: 1; }
#chart .axis { fill: var(--muted); font-size: 11px; }
#chart .ach { fill: none; stroke: var(--ach); stroke-width: 2; }
#chart .conf { fill: none; stroke: var(--conf); stroke-width: 1.5; stroke-dasharray: 6 4; }
.legend span { margin-right: 14px; } .sw-ach { color: var(--ach); } .sw-conf { color: var(--conf); }
"""

SCRIPT = """
"use strict";
const REFRESH_MS = %REFRESH% * 1000;
const SVG = "http://www.w3.org/2000/svg";
const $ = (id) => document.getElementById(id);
function fmt(x, unit, digits) {
  if (x === null || x === undefined || typeof x !== "number" || !isFinite(x)) return "\\u2013";
  return x.toFixed(digits === undefined ? 2 : digits) + (unit || "");
}
function pct(x) { return (typeof x === "number" && isFinite(x)) ? (100 * x).toFixed(0) + "%" : "\\u2013"; }
function text(s) { return (s === null || s === undefined) ? "" : String(s); }
function cell(tr, value, numeric, cls) {
  const td = document.createElement("td");
  td.textContent = text(value);
  if (numeric) td.className = "n";
  if (cls) td.classList.add(cls);
  tr.appendChild(td);
}
function fillRows(id, rows, toCells) {
  const body = $(id);
  body.replaceChildren();
  for (const r of rows) { const tr = document.createElement("tr"); toCells(tr, r); body.appendChild(tr); }
}
function card(k, v, cls) {
  const d = document.createElement("div"); d.className = "card";
  const a = document.createElement("div"); a.className = "k"; a.textContent = k;
  const b = document.createElement("div"); b.className = "v"; b.textContent = v;
  if (cls) b.classList.add(cls);
  d.append(a, b); return d;
}
function svg(tag, attrs, parent) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (parent) parent.appendChild(e);
  return e;
}
function chart(doc) {
  const el = $("chart"), W = 800, H = 240, L = 48, R = 12, T = 12, B = 26;
  el.replaceChildren();
  const hist = doc.history || {};
  // the bucket in progress is drawn from what it holds so far, not as zero
  const pts = (Array.isArray(hist.points) ? hist.points : [])
    .concat(Array.isArray(hist.partial) ? [hist.partial] : []);
  const span = Number(hist.span_s) || 900, now = Number(doc.time) || Date.now() / 1000;
  let top = 0;
  for (const p of pts) top = Math.max(top, Number(p[1]) || 0, Number(p[2]) || 0);
  top = top > 0 ? top * 1.15 : 1;
  const x = (t) => L + (W - L - R) * Math.min(1, Math.max(0, (t - (now - span)) / span));
  const y = (v) => H - B - (H - T - B) * Math.min(1, Math.max(0, (Number(v) || 0) / top));
  for (let i = 0; i <= 4; i++) {
    const v = top * i / 4, yy = y(v);
    svg("line", {x1: L, x2: W - R, y1: yy, y2: yy, class: "grid"}, el);
    const lab = svg("text", {x: L - 6, y: yy + 4, "text-anchor": "end", class: "axis"}, el);
    lab.textContent = v.toFixed(v < 10 ? 1 : 0);
  }
  for (let m = 15; m >= 0; m -= 5) {
    const t = svg("text", {x: x(now - m * 60), y: H - 8, "text-anchor": "middle", class: "axis"}, el);
    t.textContent = m ? "-" + m + " min" : "now";
  }
  const line = (i, cls) => {
    const xs = pts.filter((p) => typeof p[i] === "number")
      .map((p) => x(p[0]).toFixed(1) + "," + y(p[i]).toFixed(1));
    svg("polyline", {points: xs.join(" "), class: cls}, el);
  };
  line(2, "conf"); line(1, "ach");
  if (!pts.length) {
    const t = svg("text", {x: W / 2, y: H / 2, "text-anchor": "middle", class: "axis"}, el);
    t.textContent = "collecting: one point every " + text(hist.step_s) + " s";
  }
}
function clock(t) {
  return typeof t === "number" && t > 0 ? new Date(t * 1000).toISOString().slice(11, 19) + "Z" : "-";
}
function holdText(h) {
  const d = h.hold;
  if (!d || typeof d !== "object") return text(h.detail);
  let s = text(d.reason || d.kind) + "; since " + clock(d.since) + " until " + clock(d.until);
  if (typeof d.next_probe_in_s === "number") s += "; probe in " + fmt(d.next_probe_in_s, " s", 1);
  if (d.released_by) s += "; released by " + text(d.released_by) + " at " + clock(d.released_at);
  return s;
}
function render(doc) {
  const o = doc.overall || {}, st = o.store || {};
  $("version").textContent = "v" + text(doc.version);
  $("uptime").textContent = "up " + fmt(doc.uptime_s, " s", 0);
  const cards = $("cards"); cards.replaceChildren(
    card("configured rate", o.configured_rate ? fmt(o.configured_rate, "/s") : "off (no global gap)"),
    card("achieved rate (" + fmt(o.achieved_window_s, " s", 0) + " / 1 min)",
      fmt(o.achieved_rate, "/s") + " / " + fmt(o.achieved_rate_1m, "/s")),
    card("grants since start", text(o.grants_since_start)),
    card("queued", text(o.queued)),
    card("exempt in flight", text(o.exempt_in_flight)),
    card("cache hit rate", (o.cache && o.cache.hit_rate != null ? fmt(o.cache.hit_rate * 100, "%", 0) : "-")
      + (o.cache ? " (" + text(o.cache.slots_saved) + " slots saved)" : "")),
    card("store", text(st.active) + (st.backend && st.backend !== st.active ? " (of " + st.backend + ")" : "")
      + (st.degraded ? ": DEGRADED" : ""), st.degraded ? "degraded" : ""));
  fillRows("hosts", doc.hosts || [], (tr, h) => {
    cell(tr, h.host);
    cell(tr, h.state, false, "state-" + text(h.state).replace(/[^a-z]+/g, "-"));
    cell(tr, h.state === "ok" ? "" : fmt(h.seconds_left, " s", 1), true);
    cell(tr, fmt(h.effective_interval_s, " s", 3), true);
    cell(tr, h.queued, true); cell(tr, h.exempt_in_flight, true);
    cell(tr, h.state === "ok" ? h.detail : holdText(h));
  });
  fillRows("windows", doc.windows || [], (tr, w) => {
    cell(tr, w.service); cell(tr, w.egress); cell(tr, fmt(w.window_s, " s", 0), true);
    cell(tr, w.requests, true); cell(tr, w.limit, true);
    cell(tr, pct(w.share), true, typeof w.share === "number" && w.share >= 0.9 ? "state-blocked" : "");
  });
  fillRows("pipelines", doc.pipelines || [], (tr, p) => {
    cell(tr, p.pipeline); cell(tr, p.queued, true); cell(tr, p.grants_last_minute, true);
    cell(tr, pct(p.share), true); cell(tr, fmt(p.weight, "", 1), true);
    cell(tr, fmt(p.wait_p50_s, " s"), true);
    cell(tr, fmt(p.expected_wait_s, " s"), true); cell(tr, p.next_host);
  });
  fillRows("proxies", Array.isArray(doc.proxies) ? doc.proxies : [], (tr, x) => {
    cell(tr, text(x.id) + (x.self === true ? " (this one)" : "")); cell(tr, x.listen); cell(tr, x.version);
    cell(tr, fmt(x.last_beat_s, " s", 1), true); cell(tr, fmt(x.uptime_s, " s", 0), true);
    cell(tr, x.queued, true);
    const ps = Array.isArray(x.pipelines) ? x.pipelines : [];
    cell(tr, ps.map((q) => text(q && q.pipeline) + " " + text(q && q.queued)).join(", "));
  });
  // run --workers N: one row per worker (the figures above are their sum); none for a single process.
  const ws = Array.isArray(doc.workers) ? doc.workers : [];
  $("workers-part").hidden = ws.length === 0;
  fillRows("workers", ws, (tr, w) => {
    const up = w && w.answering === true;
    cell(tr, text(w && w.worker), true);
    cell(tr, up ? "answering" : "not answering", false, up ? "state-ok" : "state-blocked");
    cell(tr, up ? w.pid : "", true); cell(tr, up ? w.restarts : "", true);
    cell(tr, up ? fmt(w.uptime_s, " s", 0) : "", true); cell(tr, up ? fmt(w.achieved_rate, "/s") : "", true);
    cell(tr, up ? w.grants_since_start : "", true); cell(tr, up ? w.queued : "", true);
    cell(tr, up ? w.exempt_in_flight : "", true);
  });
  chart(doc);
}
async function refresh() {
  const ctl = new AbortController(), timer = setTimeout(() => ctl.abort(), 5000);
  try {
    const r = await fetch("status", {cache: "no-store", signal: ctl.signal, credentials: "same-origin"});
    if (!r.ok) throw new Error("HTTP " + r.status);
    render(await r.json());
    $("conn").textContent = "updated " + new Date().toLocaleTimeString();
    $("conn").className = "muted";
  } catch (e) {
    $("conn").textContent = "no answer from the proxy (" + text(e && e.message) + "); retrying";
    $("conn").className = "down";
  } finally {
    clearTimeout(timer);
    setTimeout(refresh, REFRESH_MS);
  }
}
refresh();
""".replace("%REFRESH%", str(REFRESH_SECONDS))

BODY = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>politeproxy status</title>
<style>%STYLE%</style></head>
<body>
<header><h1>politeproxy</h1><span id="version" class="muted"></span><span id="uptime" class="muted"></span>
<span id="conn" class="muted">loading</span></header>
<main>
<div id="cards" class="cards"></div>
<h2>Achieved vs configured rate, last 15 minutes (requests per second)</h2>
<div class="legend"><span class="sw-ach">&#9473; achieved</span>
<span class="sw-conf">&#9476; configured</span></div>
<svg id="chart" viewBox="0 0 800 240" preserveAspectRatio="none" role="img"
 aria-label="achieved and configured rate over the last 15 minutes"></svg>
<h2>Hosts</h2>
<table><thead><tr><th>host</th><th>state</th><th class="n">left</th><th class="n">interval</th>
<th class="n">queued</th><th class="n">exempt in flight</th><th>detail</th></tr></thead>
<tbody id="hosts"></tbody></table>
<h2>Request windows (Common Crawl blocks an IP above 6,000 requests in 300 s)</h2>
<table><thead><tr><th>service</th><th>egress</th><th class="n">window</th><th class="n">requests</th>
<th class="n">limit</th><th class="n">used</th></tr></thead>
<tbody id="windows"></tbody></table>
<h2>Pipelines</h2>
<table><thead><tr><th>pipeline</th><th class="n">queued</th><th class="n">grants/min</th>
<th class="n">share</th><th class="n">weight</th><th class="n">wait p50</th><th class="n">next wait</th>
<th>next host</th></tr></thead>
<tbody id="pipelines"></tbody></table>
<h2>Proxies sharing the store (heartbeats)</h2>
<table><thead><tr><th>proxy</th><th>listen</th><th>version</th><th class="n">last beat</th>
<th class="n">up</th><th class="n">queued</th><th>pipelines (queued)</th></tr></thead>
<tbody id="proxies"></tbody></table>
<section id="workers-part" hidden>
<h2>Workers of this proxy (the figures above are their sum)</h2>
<table><thead><tr><th class="n">worker</th><th>state</th><th class="n">pid</th><th class="n">restarts</th>
<th class="n">up</th><th class="n">achieved</th><th class="n">grants</th><th class="n">queued</th>
<th class="n">exempt in flight</th></tr></thead>
<tbody id="workers"></tbody></table>
</section>
</main>
<script>%SCRIPT%</script>
</body></html>
"""


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


PAGE = BODY.replace("%STYLE%", STYLE).replace("%SCRIPT%", SCRIPT).encode()

# Only the two inline blocks above, by hash; nothing from anywhere but ``status`` on this origin.
CSP = "; ".join(
    (
        "default-src 'none'",
        f"script-src {_sha256(SCRIPT)}",
        f"style-src {_sha256(STYLE)}",
        "connect-src 'self'",
        "img-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)

HEADERS = {
    "Content-Type": "text/html; charset=utf-8",
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
