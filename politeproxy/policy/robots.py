"""robots.txt Crawl-delay (policy core, no I/O).

The stdlib's robotparser only accepts whole-second delays, and Crawl-delay is often fractional, so this
reads just the groups and their Crawl-delay lines.
"""

from __future__ import annotations

import math

USER_AGENT = "politeproxy"


def crawl_delay(text: str, agent: str = USER_AGENT) -> float | None:
    """The Crawl-delay of the group naming ``agent``, else of ``*``, in seconds; None when there is none."""
    delays: dict[str, float] = {}
    group: list[str] = []
    in_agents = False
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if ":" not in line:
            continue
        key, value = (s.strip() for s in line.split(":", 1))
        key = key.lower()
        if key == "user-agent":
            if not in_agents:
                group = []
            group.append(value.lower())
            in_agents = True
            continue
        in_agents = False
        if key == "crawl-delay":
            try:
                delay = float(value)
            except ValueError:
                continue
            if math.isfinite(delay) and delay >= 0:  # float() takes "nan", "inf" and "1e400"
                for ua in group:
                    delays.setdefault(ua, delay)
    agent = agent.lower()
    for ua, delay in delays.items():
        if ua and ua != "*" and ua in agent:  # an empty User-agent line names nobody
            return delay
    return delays.get("*")


def effective_crawl_delay(found: float | None, cap: float) -> float:
    """The delay to apply: the file's, at most ``cap``; 0 when there is none (or it is not a duration)."""
    if found is None or not math.isfinite(found) or found < 0:
        return 0.0
    return min(found, cap)
