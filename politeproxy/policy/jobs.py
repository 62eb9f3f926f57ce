"""What ``politeproxy simulate --job`` reads (issue 45 item 5): a job as counts of requests per kind, not
rates; the simulation (commands/simjob.py) sends each part as fast as the proxy's pacing lets it. Policy core:
the parser returns a value or raises ``WorkloadError``, never anything else.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from politeproxy.policy.fairness import DEFAULT_PIPELINE
from politeproxy.policy.simulation import (
    DEFAULT_HOST,
    EXEMPT,
    MAX_ARRIVALS,
    MAX_STREAMS,
    MAX_TEXT,
    PACED,
    WorkloadError,
    _host,
    _pipeline,
    _shown,
)

# A job (``simulate --job``): how many requests of each kind, not how fast; a kind is a class and a host.
JOB_KINDS: dict[str, tuple[str, str]] = {
    "index": (PACED, "index.commoncrawl.org"),  # CDX lookups: paced, within the index host's own interval
    "warc": (PACED, DEFAULT_HOST),  # WARC records: range reads of /crawl-data/, paced
    "paced": (PACED, DEFAULT_HOST),
    "exempt": (EXEMPT, DEFAULT_HOST),  # columnar range reads (the paths of an exempt rule)
}
_JOB_ITEM = re.compile(r"(?:([^:=@]*):)? *([A-Za-z]+) *(?:@([^=]*))?= *([0-9]{1,9}) *")


@dataclass(frozen=True, slots=True)
class JobPart:
    """``count`` requests of one kind from one pipeline to one host."""

    pipeline: str
    kind: str
    klass: str
    host: str
    count: int


def parse_job(text: str) -> tuple[JobPart, ...]:
    """A job's parts: comma-separated ``[PIPELINE:]KIND[@HOST]=COUNT`` items (``index=20000,warc=1000000``);
    two items of one pipeline, class and host add their counts (under the first one's kind)."""
    if not isinstance(text, str) or not text.strip():
        raise WorkloadError('an empty job: give counts per kind, e.g. "index=20000,warc=1000000"')
    if len(text) > MAX_TEXT:
        raise WorkloadError(f"the job is {len(text)} characters long; at most {MAX_TEXT}")
    merged: dict[tuple[str, str, str], JobPart] = {}
    for part in text.split(","):
        m = _JOB_ITEM.fullmatch(part.strip())
        if m is None:
            raise WorkloadError(f'{_shown(part)}: expected [PIPELINE:]KIND[@HOST]=COUNT, e.g. "index=20000"')
        pipe, kind, host, n = m.groups()
        if (kind := kind.lower()) not in JOB_KINDS:
            raise WorkloadError(f"{_shown(part)}: the kind is {', '.join(JOB_KINDS)}, not {kind!r}")
        klass, default_host = JOB_KINDS[kind]
        pipeline = DEFAULT_PIPELINE if pipe is None else _pipeline(pipe)
        j = JobPart(pipeline, kind, klass, default_host if host is None else _host(host), int(n))
        key = (j.pipeline, j.klass, j.host)
        old = merged.get(key)
        merged[key] = j if old is None else JobPart(*key[:1], old.kind, j.klass, j.host, old.count + j.count)
        if len(merged) > MAX_STREAMS:
            raise WorkloadError(f"more than {MAX_STREAMS} parts in one job")
    out = tuple(j for j in merged.values() if j.count > 0)
    if not out:
        raise WorkloadError("the job has no requests")
    if (total := sum(j.count for j in out)) > MAX_ARRIVALS:
        raise WorkloadError(f"the job makes {total:,} requests; at most {MAX_ARRIVALS:,}")
    return out
