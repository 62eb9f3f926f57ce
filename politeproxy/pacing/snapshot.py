"""A read-only look at the pacer for the status view: what waits where, and how long a new request would.

Nothing here changes the pacer or awaits: ``take`` copies the counts the pacer keeps anyway (every one bounded
by live waiters, exempt places or the hint cap), and ``expected_wait`` asks the queue state the same question
the pacer asks before it admits a request (``QueueState.estimate``).
"""

from __future__ import annotations

from dataclasses import dataclass

from politeproxy.pacing.pacer import Pacer


@dataclass(frozen=True)
class PacerSnapshot:
    """The pacer's counts at one moment (``at``, monotonic seconds)."""

    at: float
    gap: float  # global seconds between grants, 0 = off
    grants: int  # slots granted by this process since start
    queued: int  # paced waiters in every line
    queued_by_host: dict[str, int]
    queued_by_pipeline: dict[str, int]
    lines: dict[tuple[str, str], int]  # (pipeline, host) -> waiters in that FIFO line
    exempt_in_flight: dict[str, int]  # host -> exempt reads holding a place now
    exempt_waiting_by_pipeline: dict[str, int]  # exempt reads waiting for a place
    ready_in: dict[str, float]  # host -> seconds until the local hint lets it be claimed (> 0 only)
    weights: dict[str, float]  # configured pipelines' weights (others weigh 1)

    def busiest_host(self, pipeline: str) -> str | None:
        """The host where ``pipeline`` has the most paced waiters now (ties: the name), or None."""
        mine = [(n, h) for (p, h), n in self.lines.items() if p == pipeline and n > 0]
        return min(mine, key=lambda x: (-x[0], x[1]))[1] if mine else None


def take(pacer: Pacer) -> PacerSnapshot:
    now = pacer.monotonic()
    st = pacer.state
    return PacerSnapshot(
        at=now,
        gap=pacer.settings.gap,
        grants=pacer.grants,
        queued=st.total,
        queued_by_host=dict(st.by_host),
        queued_by_pipeline=dict(st.by_pipeline),
        lines={key: len(q) for key, q in st.queues.items()},
        exempt_in_flight={h: n for h, n in pacer.places.snapshot().items() if n > 0},
        exempt_waiting_by_pipeline=dict(pacer.places.waiting_by_pipeline),
        ready_in={h: t - now for h, t in st.ready.items() if t > now},
        weights={r.name: r.weight for r in pacer.settings.pipelines},
    )


def expected_wait(pacer: Pacer, pipeline: str, host: str, interval: float | None = None) -> float:
    """Seconds a request of ``pipeline`` for ``host`` queued now would wait, as far as this process sees.

    The pacer's own admission estimate: the waiters that go before it on the global schedule (its
    pipeline's own, and of the others only those whose fair-queuing start tag comes first) times the gap,
    or the host's local ready hint plus the waiters ahead for that host times ``max(gap, interval)``,
    whichever is longer. ``interval`` is the host's effective interval (adaptive, from the store); the
    configured one when None. A lower bound: other proxies on the shared store take slots too.
    """
    s = pacer.settings
    iv = max(s.interval_for(host), interval or 0.0)
    return max(0.0, pacer.state.estimate(host, pacer.monotonic(), s.gap, iv, pipeline))
