"""``politeproxy simulate``: a workload or a proxy's access log through this config's pacing on a virtual
clock (issue 24 item 6); the simulation itself is ``commands/simloop.py``, what it reads and reports
``policy/simulation.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any

from politeproxy.commands.simloop import T0, Simulation
from politeproxy.config.loading import Config
from politeproxy.pacing.base import PacingSettings
from politeproxy.policy.hosts import HostSet, host_matches
from politeproxy.policy.settings import ConfigError, parse_duration
from politeproxy.policy.simulation import (
    CC_LIMIT,
    CC_WINDOW,
    EXEMPT,
    MAX_ARRIVALS,
    MAX_LINE,
    MAX_LOG,
    MAX_LONG_LINE,
    PACED,
    Arrival,
    Stream,
    WorkloadError,
    arrivals,
    count,
    log_arrivals,
    parse_workload,
    pipeline_row,
    render,
    service_row,
)

# -- the command ------------------------------------------------------------------------------------------


def _streams(text: str, cfg: Config, notes: list[str]) -> list[Stream]:
    """The workload's streams as this config's proxy would see them: a host it does not pace is an error;
    an exempt stream to a host no exempt rule names is paced (as the proxy would classify it)."""
    paced = HostSet(cfg.paced_hosts)
    rules = cfg.exempt_rules()
    out = []
    for s in parse_workload(text):
        if not paced.matches(s.host):
            raise WorkloadError(f"{s.host} is not a paced host in this config: the proxy would not count it")
        if s.klass == EXEMPT and not any(host_matches(s.host, r.host) for r in rules):
            notes.append(f"no exempt rule names {s.host}: its exempt stream is simulated as paced")
            s = Stream(s.pipeline, PACED, s.host, s.rate)
        out.append(s)
    return out


def _as_configured(logged: list[Arrival], cfg: Config, notes: list[str]) -> list[Arrival]:
    """A log's requests as this config's proxy would take them (the log may come from another config): a
    host it does not pace is left out, an exempt read to a host no exempt rule names is paced."""
    paced = HostSet(cfg.paced_hosts)
    rules = cfg.exempt_rules()
    out, skipped, moved = [], set(), set()
    for a in logged:
        if not paced.matches(a.host):
            skipped.add(a.host)
            continue
        if a.klass == EXEMPT and not any(host_matches(a.host, r.host) for r in rules):
            moved.add(a.host)
            a = Arrival(a.t, a.pipeline, PACED, a.host)
        out.append(a)
    if skipped:
        notes.append(f"not paced in this config, left out: {', '.join(sorted(skipped)[:5])}")
    if moved:
        notes.append(f"no exempt rule names {', '.join(sorted(moved)[:5])}: its exempt reads are paced")
    if not out:
        raise WorkloadError("none of the log's requests is to a host this config paces")
    return out


def bounded_lines(
    f: IO[str], limit: int = MAX_LINE, longest: int = MAX_LONG_LINE, total: int = MAX_LOG
) -> Iterator[str]:
    """The lines of ``f``, each read at most ``limit`` characters at a time: a longer one is skipped
    whole, so a log without newlines never fills the memory. A line longer than ``longest``, or more than
    ``total`` characters in all, is no access log (``--log /dev/zero`` never ended): WorkloadError."""
    read = 0
    while line := f.readline(limit + 1):
        read += len(line)
        too_long = len(line) > limit and not line.endswith("\n")
        if too_long:
            skipped = 0
            while (rest := f.readline(limit + 1)) and not rest.endswith("\n"):
                skipped += len(rest)
                if skipped > longest:
                    raise WorkloadError(f"a line of more than {longest:,} characters: not an access log")
            read += skipped + len(rest)
        if read > total:
            raise WorkloadError(f"more than {total:,} characters of log; cut it first")
        if not too_long:
            yield line


def _requests(args: argparse.Namespace, cfg: Config, seconds: float, notes: list[str]) -> Iterable[Arrival]:
    if args.log and args.workload:
        raise WorkloadError("give --workload or --log, not both")
    if args.log:
        with open(args.log, encoding="utf-8", errors="replace") as f:
            return _as_configured(log_arrivals(bounded_lines(f), seconds), cfg, notes)
    if not args.workload:
        raise WorkloadError('give --workload "exempt=50/s,paced=5/s" or --log FILE')
    streams = _streams(args.workload, cfg, notes)
    if (n := count(streams, seconds)) > MAX_ARRIVALS:
        raise WorkloadError(
            f"the workload makes {n:,} requests; at most {MAX_ARRIVALS:,} (a shorter --duration)"
        )
    return arrivals(streams, seconds)


def simulate(
    settings: PacingSettings, requests: Iterable[Arrival], seconds: float, shortcut: bool = True
) -> dict[str, Any]:
    """Run ``requests`` through ``settings``' pacing; the report (``--json`` prints it)."""
    sim = Simulation(settings, shortcut)
    sim.run(requests)
    services = {
        name: service_row(t, settings.window, rule.limit if (rule := settings.window_for(name)) else 0)
        for name, t in sorted(sim.services.items())
    }
    return {
        "duration_s": round(sim.end - T0, 3),
        "simulated_s": seconds,
        "window_s": settings.window,
        "cc_window_s": CC_WINDOW,
        "store_calls": sim.calls,
        "services": services,
        "pipelines": {name: pipeline_row(t) for name, t in sorted(sim.pipelines.items())},
        "over_limit": [n for n, v in services.items() if 0 < v["window_limit"] < v["window_peak"]],
        "over_cc": [n for n, v in services.items() if v["cc_peak"] > CC_LIMIT],
    }


def main(args: argparse.Namespace, cfg: Config) -> int:
    """Run the simulation the arguments describe; 0, or 2 with one line on stderr for input it cannot use."""
    notes: list[str] = []
    try:
        seconds = parse_duration(args.duration, "--duration")
        if seconds <= 0:
            raise WorkloadError("--duration: a span above 0, e.g. 1h")
        requests = _requests(args, cfg, seconds, notes)
        started = time.perf_counter()
        r = simulate(cfg.pacing(), requests, seconds)
    except (WorkloadError, ConfigError) as e:
        print(f"politeproxy: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"politeproxy: error: --log {args.log}: {e.strerror or e}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - started
    if args.json:
        print(json.dumps(r))
        return 0
    source = f"--log {args.log}" if args.log else repr(args.workload)
    what = f"{args.duration.strip()} of {source} through {cfg.source}"
    print(render(r, what, notes))
    print(f"(simulated in {elapsed:.1f}s)")
    return 0
