"""``politeproxy simulate --job "index=20000,warc=1000000"``: how long a job takes (issue 45 item 5).

A job is counts, not rates. Each part (a pipeline's requests of one kind) keeps ``IN_FLIGHT`` requests at the
proxy and sends the next one when one goes (an answer takes no time here), so every part asks as fast as
the proxy's pacing lets it: the same simulation as a workload (commands/simloop.py, the proxy's own claim,
fair queue and settings), fed by its own grants. A refused request is asked again ``RETRY_AFTER`` later, as
a client's retry would. The report says when the last request of each part goes, and the window peaks.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from politeproxy.commands.simloop import T0, Simulation
from politeproxy.config.loading import Config
from politeproxy.pacing.base import PacingSettings
from politeproxy.policy.hosts import HostSet, host_matches
from politeproxy.policy.jobs import JobPart, parse_job
from politeproxy.policy.settings import ConfigError
from politeproxy.policy.simulation import (
    CC_LIMIT,
    CC_WINDOW,
    EXEMPT,
    MAX_ARRIVALS,
    PACED,
    Arrival,
    WorkloadError,
    pipeline_row,
    render,
    service_row,
)

IN_FLIGHT = 4  # requests each part keeps at the proxy: a pipeline with a few threads
RETRY_AFTER = 1.0  # seconds before a refused request is asked again
MAX_ASKS = 2 * MAX_ARRIVALS  # requests and retries together: a config that refuses forever still ends

Key = tuple[str, str, str]  # (pipeline, class, host): what an Arrival says of its part


class JobSimulation(Simulation):
    """The simulation of a workload, whose requests are made by its own grants."""

    def __init__(self, settings: PacingSettings, parts: tuple[JobPart, ...]) -> None:
        super().__init__(settings)
        self.parts = {(p.pipeline, p.klass, p.host): p for p in parts}
        self.left = {k: p.count for k, p in self.parts.items()}
        self.last = dict.fromkeys(self.parts, T0)
        self.sent = dict.fromkeys(self.parts, 0)
        self.retried = dict.fromkeys(self.parts, 0)
        self.asks = 0

    def start(self) -> None:
        for key in self.parts:
            for _ in range(min(IN_FLIGHT, self.left[key])):
                self._ask_next(key, T0)
        self.run(())

    def _ask_next(self, key: Key, at: float) -> None:
        if self.left[key] <= 0 or self.asks >= MAX_ASKS:
            return
        self.left[key] -= 1
        self.asks += 1
        self._at(at, "arrive", Arrival(at - T0, *key))

    def _sent(self, a: Arrival, at: float) -> None:
        super()._sent(a, at)
        key = (a.pipeline, a.klass, a.host)
        if key in self.parts:  # a name beyond the proxy's bound counts as "other": not this job's part
            self.sent[key] += 1
            self.last[key] = max(self.last[key], at)
            self._ask_next(key, at)

    def _refused(self, a: Arrival) -> None:
        super()._refused(a)
        key = (a.pipeline, a.klass, a.host)
        if key in self.parts:
            self.left[key] += 1  # the same request, asked again
            self.retried[key] += 1
            self._ask_next(key, self.now + RETRY_AFTER)


def simulate_job(settings: PacingSettings, parts: tuple[JobPart, ...]) -> dict[str, Any]:
    """Run ``parts`` through ``settings``' pacing; the report (``--json`` prints it)."""
    sim = JobSimulation(settings, parts)
    sim.start()
    services = {
        name: service_row(t, settings.window, rule.limit if (rule := settings.window_for(name)) else 0)
        for name, t in sorted(sim.services.items())
    }
    rows: list[dict[str, Any]] = [
        {
            "pipeline": p.pipeline,
            "kind": p.kind,
            "host": p.host,
            "requests": p.count,
            "sent": sim.sent[k],
            "retried": sim.retried[k],
            "last_s": round(sim.last[k] - T0, 3),
        }
        for k, p in sim.parts.items()
    ]
    return {
        "duration_s": round(max(sim.last.values()) - T0, 3),
        "window_s": settings.window,
        "cc_window_s": CC_WINDOW,
        "parts": rows,
        "pipelines": {name: pipeline_row(t) for name, t in sorted(sim.pipelines.items())},
        "unfinished": [f"{r['pipeline']}:{r['kind']}" for r in rows if r["sent"] < r["requests"]],
        "services": services,
        "over_limit": [n for n, v in services.items() if 0 < v["window_limit"] < v["window_peak"]],
        "over_cc": [n for n, v in services.items() if v["cc_peak"] > CC_LIMIT],
    }


def when(seconds: float) -> str:
    """``12,345.6 s (3h 25m)``: the seconds, and hours and minutes for a person."""
    minutes = int(seconds // 60)
    return f"{seconds:,.1f} s ({minutes // 60}h {minutes % 60:02d}m)"


def render_job(r: dict[str, Any], what: str, notes: list[str]) -> str:
    lines = [render(r, what, notes), "", "the last request of each part goes at:"]
    width = max(len(f"{p['pipeline']}:{p['kind']}") for p in r["parts"])
    for p in r["parts"]:
        name = f"{p['pipeline']}:{p['kind']}".ljust(width)
        retried = f", {p['retried']:,} asked again after a refusal" if p["retried"] else ""
        lines.append(
            f"  {name}  {p['sent']:,} of {p['requests']:,} to {p['host']}: {when(p['last_s'])}{retried}"
        )
    if r["unfinished"]:
        lines.append(f"unfinished (refused past {MAX_ASKS:,} asks): {', '.join(r['unfinished'])}")
    return "\n".join(lines)


def _as_configured(parts: tuple[JobPart, ...], cfg: Config, notes: list[str]) -> tuple[JobPart, ...]:
    """The parts as this config's proxy would take them: a host it does not pace is an error; an exempt part
    to a host no exempt rule names is paced (as ``simulate --workload`` does)."""
    paced, rules, out = HostSet(cfg.paced_hosts), cfg.exempt_rules(), []
    for p in parts:
        if not paced.matches(p.host):
            raise WorkloadError(f"{p.host} is not a paced host in this config: the proxy would not count it")
        if p.klass == EXEMPT and not any(host_matches(p.host, r.host) for r in rules):
            notes.append(f"no exempt rule names {p.host}: its exempt part is simulated as paced")
            p = JobPart(p.pipeline, p.kind, PACED, p.host, p.count)
        out.append(p)
    return tuple(out)


def main(args: argparse.Namespace, cfg: Config) -> int:
    """``simulate --job``: 0, or 2 with one line on stderr for a job it cannot use."""
    notes = [
        f"each part keeps {IN_FLIGHT} requests at the proxy, answers take no time: the pacing sets the pace"
    ]
    try:
        if args.log or args.workload:
            raise WorkloadError("give --job alone, without --workload or --log")
        parts = parse_job(args.job)
        parts = _as_configured(parts, cfg, notes)
        started = time.perf_counter()
        r = simulate_job(cfg.pacing(), parts)
    except (WorkloadError, ConfigError) as e:
        print(f"politeproxy: error: {e}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - started
    if args.json:
        print(json.dumps(r))
        return 0
    print(render_job(r, f"the job {args.job!r} through {cfg.source}", notes))
    print(f"(simulated in {elapsed:.1f}s)")
    return 0
