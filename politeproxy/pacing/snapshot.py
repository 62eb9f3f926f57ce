"""The one read path into the pacer: ``Pacer.snapshot()``, a frozen copy for the status document, the
health answer and the gauges (with the schedule store's name and whether it is degraded: nothing outside the
pacing package reads the store).

Nothing here changes the pacer or awaits: ``take`` copies the counts the pacer keeps anyway (every one bounded
by live waiters, exempt places, the hint cap or the pipelines served in about the last round), and
``PacerSnapshot.expected_wait`` asks the copies the same question the pacer asks before it admits a request
(``state.estimate``). This module imports nothing of pacer.py: the pacer hands its parts in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from politeproxy.pacing.base import PacingSettings
from politeproxy.pacing.exempt import ExemptPlaces
from politeproxy.pacing.state import Line, QueueState, T, estimate
from politeproxy.policy.fairness import FairTags


@dataclass(frozen=True, slots=True)
class PacerSnapshot:
    """The pacer's counts at one moment (``at``, monotonic seconds)."""

    at: float
    settings: PacingSettings  # the settings in force (frozen itself)
    grants: int  # slots granted by this process since start
    queued: int  # paced waiters in every line
    queued_by_host: dict[str, int]
    queued_by_pipeline: dict[str, int]
    lines: dict[Line, int]  # (pipeline, host) -> waiters in that FIFO line
    exempt_in_flight: dict[str, int]  # host -> exempt reads holding a place now
    exempt_waiting_by_pipeline: dict[str, int]  # exempt reads waiting for a place
    ready_in: dict[str, float]  # host -> seconds until the local hint lets it be claimed (> 0 only)
    hosts: frozenset[str]  # hosts worth a look: a line, a ready hint (also just passed), or exempt reads
    tags: FairTags  # a copy of the fair-queuing tags, for expected_wait
    store: str = ""  # the schedule store answering now (a failover store names the active one)
    degraded: bool = False  # the shared store does not answer: this proxy paces on its fallback
    reasons: dict[str, str] = field(default_factory=dict)  # host -> why this proxy last held it (issue 24)
    lead: float = 0.0  # seconds before the first slot free for the lines (the slot under way, a gap on)

    @property
    def gap(self) -> float:
        """Global seconds between grants, 0 = off."""
        return self.settings.gap

    @property
    def weights(self) -> dict[str, float]:
        """Configured pipelines' weights (others weigh 1)."""
        return {r.name: r.weight for r in self.settings.pipelines}

    def busiest_host(self, pipeline: str) -> str | None:
        """The host where ``pipeline`` has the most paced waiters now (ties: the name), or None."""
        mine = [(n, h) for (p, h), n in self.lines.items() if p == pipeline and n > 0]
        return min(mine, key=lambda x: (-x[0], x[1]))[1] if mine else None

    def expected_wait(self, pipeline: str, host: str, interval: float | None = None) -> float:
        """Seconds a request of ``pipeline`` for ``host`` queued at ``at`` would wait, as far as this
        process sees.

        The pacer's own admission estimate: the waiters that go before it on the global schedule (its
        pipeline's own, and of the others only those whose fair-queuing start tag comes first) times the
        gap (after the slot under way), or the host's local ready hint plus the waiters ahead for that
        host times ``max(gap, interval)``, whichever is longer. ``interval`` is the host's effective interval
        (adaptive, from the store); the configured one when None. A lower bound: other proxies on the
        shared store take slots too.
        """
        s = self.settings
        iv = max(s.interval_for(host), interval or 0.0)
        if not self.lines:
            return max(self.lead, self.ready_in.get(host, 0.0))
        # ready_in holds seconds left, so "now" is 0 here
        lines = self.lines.items()
        wait = estimate(lines, self.ready_in, 0.0, self.tags, host, s.gap, iv, pipeline, lead=self.lead)
        return max(0.0, wait)


def take(
    now: float,
    settings: PacingSettings,
    grants: int,
    state: QueueState[T],
    places: ExemptPlaces,
    store: tuple[str, bool] = ("", False),
    reasons: dict[str, str] | None = None,
) -> PacerSnapshot:
    """Copy the pacer's parts at ``now`` (its clock); ``store`` is the store's (name, degraded)."""
    live, tags = state.tags, FairTags()
    tags.vtime, tags.finish, tags.weights = live.vtime, dict(live.finish), dict(live.weights)
    return PacerSnapshot(
        at=now,
        settings=settings,
        grants=grants,
        queued=state.total,
        queued_by_host=dict(state.by_host),
        queued_by_pipeline=dict(state.by_pipeline),
        lines={key: len(q) for key, q in state.queues.items()},
        exempt_in_flight={h: n for h, n in places.snapshot().items() if n > 0},
        exempt_waiting_by_pipeline=dict(places.waiting_by_pipeline),
        ready_in={h: t - now for h, t in state.ready.items() if t > now},
        hosts=frozenset(state.hosts() | places.hosts()),
        tags=tags,
        store=store[0],
        degraded=store[1],
        reasons=reasons or {},
        lead=state.lead(now, settings.gap),
    )
