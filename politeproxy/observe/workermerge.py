"""The whole proxy from its workers' parts (``politeproxy run --workers N``): one /metrics text with a
``worker`` label on every sample, and one /status document that sums what each worker counts alone.

Pure functions of what the workers answered (``None`` for one that did not: it is restarting, or slow),
so the merge is tested without a process. What the workers share (the store: holds, backoff, windows,
intervals) is the same in every document and is taken from the first; what each worker counts alone
(grants, queues, exempt reads, cache results) is summed. prometheus-client's multiprocess mode is not used:
it cannot carry the custom collectors (the achieved-rate window), and a label keeps every series exact.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

WORKER_LABEL = "worker"
log = logging.getLogger("politeproxy.admin")

# Counted by each worker alone: summed over the workers.
SUMMED_OVERALL = ("achieved_rate", "achieved_rate_1m", "grants_since_start", "queued", "exempt_waiting",
                  "exempt_in_flight")  # fmt: skip
SUMMED_HOST = ("queued", "exempt_in_flight")
SUMMED_PIPELINE = ("queued", "exempt_waiting", "grants_last_minute")
LATEST_PIPELINE = ("wait_p50_s", "expected_wait_s")  # the largest (a worker's p50s do not add up)


def _num(v: float | None, digits: int = 3) -> float | None:
    return None if v is None else round(v, digits)


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def merge_metrics(parts: Sequence[tuple[int, str | None]], configured: int) -> bytes:
    """One exposition of every worker's text, each sample labelled ``worker="<index>"``, and the gauge
    ``politeproxy_workers{state}``: configured, and answering this scrape. A text that does not parse
    is left out (counted as not answering), never a 500 for the whole scrape."""
    families: dict[str, Metric] = {}
    answering = 0
    for index, text in parts:
        if text is None:
            continue
        try:
            parsed = list(text_string_to_metric_families(text))
        except ValueError as e:
            log.warning("worker %d's /metrics does not parse: %s", index, e)
            continue
        answering += 1
        for fam in parsed:
            out = families.get(fam.name)
            if out is None:
                out = families[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            label = {WORKER_LABEL: str(index)}
            out.samples.extend(s._replace(labels={**s.labels, **label}) for s in fam.samples)
    workers = GaugeMetricFamily(
        "politeproxy_workers", "Worker processes of this proxy: configured, and answering this scrape",
        labels=["state"],
    )  # fmt: skip
    workers.add_metric(["configured"], configured)
    workers.add_metric(["answering"], answering)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([*families.values(), workers]))
    return generate_latest(registry)


def worker_row(index: int, doc: dict[str, Any] | None) -> dict[str, Any]:
    """One worker's line in ``workers`` of /status."""
    if doc is None:
        return {"worker": index, "answering": False}
    me = doc.get("worker") or {}
    overall = doc.get("overall") or {}
    return {
        "worker": index,
        "answering": True,
        "pid": me.get("pid"),
        "restarts": me.get("restarts", 0),
        "uptime_s": doc.get("uptime_s"),
        "achieved_rate": overall.get("achieved_rate"),
        "grants_since_start": overall.get("grants_since_start"),
        "queued": overall.get("queued"),
        "exempt_in_flight": overall.get("exempt_in_flight"),
    }


def _add(into: dict[str, Any], other: dict[str, Any], keys: Iterable[str]) -> None:
    for k in keys:
        a, b = into.get(k), other.get(k)
        if isinstance(b, int | float) and not isinstance(b, bool):
            into[k] = _num((a if isinstance(a, int | float) else 0) + b)
            if isinstance(a, int) and isinstance(b, int):
                into[k] = a + b


def _merge_rows(rows: list[dict[str, Any]], more: list[dict[str, Any]], key: str, keys: Sequence[str],
                largest: Sequence[str] = ()) -> None:  # fmt: skip
    """Rows (hosts, pipelines) by ``key``: counts summed, ``largest`` the largest; new names appended."""
    by = {r.get(key): r for r in rows}
    for r in more:
        mine = by.get(r.get(key))
        if mine is None:
            rows.append(by.setdefault(r.get(key), copy.deepcopy(r)))
            continue
        _add(mine, r, keys)
        for k in largest:
            values = [v for v in (mine.get(k), r.get(k)) if isinstance(v, int | float)]
            mine[k] = max(values) if values else None


def _merge_cache(into: dict[str, Any], other: dict[str, Any]) -> None:
    # The cache directory is shared: its size is one number; the results are each worker's.
    _add(into, other, [k for k, v in other.items() if isinstance(v, int) and k != "bytes"])
    mine, theirs = into.setdefault("index_pipelines", {}), other.get("index_pipelines") or {}
    for name, counts in theirs.items() if isinstance(theirs, dict) and isinstance(mine, dict) else ():
        if isinstance(counts, dict):
            _add(mine.setdefault(name, {}), counts, [k for k, v in counts.items() if isinstance(v, int)])
    looked = sum(into.get(k, 0) or 0 for k in ("hit", "miss", "stale"))
    into["hit_rate"] = _num(into.get("hit", 0) / looked) if looked else None


def _merge_history(into: dict[str, Any], other: dict[str, Any]) -> None:
    """Points aligned from the newest (the workers sample on the same step, at their own phase)."""
    mine, theirs = into.get("points") or [], other.get("points") or []
    for a, b in zip(reversed(mine), reversed(theirs), strict=False):
        a[1] = _num((a[1] or 0) + (b[1] or 0))
        a[3] = (a[3] or 0) + (b[3] or 0)
    p, q = into.get("partial"), other.get("partial")
    if p is not None and q is not None:
        p[1] = _num((p[1] or 0) + (q[1] or 0))
        p[3] = (p[3] or 0) + (q[3] or 0)


def merge_status(parts: Sequence[tuple[int, dict[str, Any] | None]]) -> dict[str, Any] | None:
    """The whole proxy's /status from each worker's, the answering worker's own first; ``workers`` lists
    every worker, answering or not. None when no worker answered."""
    live = [d for _i, d in parts if d is not None]
    if not live:
        return None
    doc = copy.deepcopy(live[0])
    doc.pop("worker", None)
    for other in live[1:]:
        _add(doc.setdefault("overall", {}), other.get("overall") or {}, SUMMED_OVERALL)
        _merge_cache(doc["overall"].setdefault("cache", {}), (other.get("overall") or {}).get("cache") or {})
        _merge_rows(doc.setdefault("hosts", []), other.get("hosts") or [], "host", SUMMED_HOST)
        pipes = doc.setdefault("pipelines", [])
        _merge_rows(pipes, other.get("pipelines") or [], "pipeline", SUMMED_PIPELINE, LATEST_PIPELINE)
        _merge_history(doc.setdefault("history", {}), other.get("history") or {})
        doc["uptime_s"] = max(doc.get("uptime_s") or 0, other.get("uptime_s") or 0)
    pipes = doc.get("pipelines") or []
    total = sum(r.get("grants_last_minute") or 0 for r in pipes)
    for r in pipes:
        r["share"] = _num((r.get("grants_last_minute") or 0) / total) if total else 0.0
    pipes.sort(key=lambda r: (-(r.get("queued") or 0), -(r.get("grants_last_minute") or 0), r["pipeline"]))
    doc["workers"] = [worker_row(i, d) for i, d in parts]
    return doc
