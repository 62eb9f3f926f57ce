"""What the pacing modules share: settings, the refusal, the events metrics hears, and
a log that does not flood on a persistent error."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any, TypeVar

from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.classify import Klass
from politeproxy.policy.clients import DEFAULT_CLIENT_RULES, ClientRule, bound_for
from politeproxy.policy.fairness import DEFAULT_PIPELINE, PipelineRule
from politeproxy.policy.hosts import host_matches
from politeproxy.policy.loglimit import LogLimiter, error_key, error_line
from politeproxy.policy.services import service_key
from politeproxy.policy.table import DEFAULT_HOST_INTERVALS, Sections, default, from_table, table_values
from politeproxy.policy.window import WindowRule
from politeproxy.stores.base import StoreError

INDEX_HOST_INTERVAL: float = dict(DEFAULT_HOST_INTERVALS)["index.commoncrawl.org"]
# Waiters one proxy holds at most (paced lines plus exempt places together). Each client connection holds
# at most one, so this only bites when pacing is off and a host backs off, or under a flood.
DEFAULT_MAX_QUEUE: int = default("pacing.max_queue")
MEMO_MAX = 1024  # host names and user agents remembered per settings object


@dataclass(frozen=True)
class PacingSettings:
    """What the pacer reads, from five sections of the table: each ``from_table`` field names its key once
    (its default is the table's); the rest are built from rule tables by config/parts.py."""

    gap: float = from_table("schedule.global_rate")  # global seconds between grants; 0 = off
    max_wait: float = from_table("pacing.max_wait")
    # issue 41: the hold bound per client (User-Agent prefix), in place of max_wait for the clients it matches
    client_rules: tuple[ClientRule, ...] = DEFAULT_CLIENT_RULES
    retries: int = from_table("pacing.retries")
    throttle_codes: frozenset[int] = from_table("pacing.throttle_codes", frozenset)
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    # host pattern -> minimum interval; index.commoncrawl.org is one fragile server
    host_intervals: tuple[tuple[str, float], ...] = DEFAULT_HOST_INTERVALS
    exempt_max_in_flight: int = from_table("exempt.max_in_flight")
    exempt_respect_backoff: bool = from_table("exempt.respect_backoff")
    max_queue: int = from_table("pacing.max_queue")
    # [pipelines.NAME] weight / max_queued; a pipeline not listed has weight 1 and no cap of its own
    pipelines: tuple[PipelineRule, ...] = ()
    # issue 12: codes that block (hold, then one probe); the GCRA ceiling of exempt reads (0 = off)
    block_codes: frozenset[int] = from_table("pacing.block_codes", frozenset)
    exempt_rate: float = from_table("exempt.rate")
    exempt_burst: int = from_table("exempt.burst")
    # issue 24: the request window per egress and service (policy.window); a limit of 0 = no window
    egress: str = "local"  # the loaded config's is [egress] name, else the host name (config/parts.py)
    window: float = from_table("egress.window")
    window_limit: int = from_table("egress.limit")
    # issue 43: the index service rests this long after a warning (policy.indexanswers.index_rest)
    index_rest: float = from_table("pacing.index_rest")

    @classmethod
    def of(cls, sections: Sections, **built: Any) -> PacingSettings:
        """The settings of ``sections``: every ``from_table`` field read by its key, the rest ``built``."""
        return cls(**table_values(cls, sections), **built)

    def interval_for(self, host: str) -> float:
        # asked several times per request: the patterns matched once per host name
        found = self._intervals.get(host)
        return found if found is not None else _kept(self._intervals, host, self._match_interval(host))

    def _match_interval(self, host: str) -> float:
        """The interval of the first pattern ``host`` matches, else 0."""
        for pattern, interval in self.host_intervals:
            if host_matches(host, pattern):
                return interval
        return 0.0

    @cached_property
    def _intervals(self) -> dict[str, float]:
        """The memo of ``interval_for`` (not a field: settings compare and print by their fields alone)."""
        return {}

    @cached_property
    def _bounds(self) -> dict[str | None, float]:
        """The memo of ``bound_for``."""
        return {}

    def pace_for(self, host: str) -> float:
        """The least time between two grants to ``host``: the global gap or its own interval, the longer."""
        return max(self.gap, self.interval_for(host))

    def bound_for(self, user_agent: str | None) -> float:
        """How long a request from a client with ``user_agent`` may be held (its rule's, else max_wait)."""
        found = self._bounds.get(user_agent)
        if found is not None:
            return found
        return _kept(self._bounds, user_agent, bound_for(self.client_rules, user_agent, self.max_wait))

    def window_for(self, host: str) -> WindowRule | None:
        """The request window of ``host``'s service, or None when windows are off."""
        if self.window_limit <= 0:
            return None
        return _window_for(host, self.egress, self.window, self.window_limit)


@lru_cache(maxsize=4096)  # asked per grant; bounded: hosts are client-chosen
def _window_for(host: str, egress: str, seconds: float, limit: int) -> WindowRule:
    return WindowRule(service_key(host), egress, seconds, limit)


K = TypeVar("K")


def _kept(memo: dict[K, float], key: K, value: float) -> float:
    """``value`` remembered under ``key``; a full memo is emptied first (its keys are client-chosen)."""
    if len(memo) >= MEMO_MAX:
        memo.clear()
    memo[key] = value
    return value


def window_full(s: PacingSettings, host: str, wait: float) -> str:
    """Why a request the window has no room for is refused (the 503's text)."""
    w = s.window_for(host)
    if w is None:
        return ""
    return (
        f"the request window of {w.service} is full ({w.limit} requests per {w.seconds:g}s, egress.limit); "
        f"this request would wait {wait:.1f}s"
    )


class WaitTooLong(Exception):
    """The request would be held past its bound (or the queue is full); ``wait`` is how long until it
    could go, ``reason`` the rejection counter's label ("max_wait" or "queue_full"). A refusal from
    ``Pacer.permit`` carries ``note``: "<host> is blocked since <time> until <time> (why)" (or backing off)
    when the proxy knows the host rests, else ""; ``message`` is what the client's 503 says: the rest when
    there is one (one cause, one text, whichever limit refused), else ``why``."""

    def __init__(self, wait: float, why: str, reason: str = "max_wait") -> None:
        super().__init__(why)
        self.wait = wait
        self.why = why
        self.reason = reason
        self.note = ""

    @property
    def message(self) -> str:
        return self.note or self.why


class PacerEvents:
    """What the pacer reports, each event declared once, here: a method that does nothing (so this class
    is also the sink that hears nothing: tests, tools). ``metrics.Metrics`` and ``status.StatusEvents``
    subclass it and override what they hear; ``observe/fanout.py`` joins them. The pacer knows nothing of
    Prometheus. ``pipeline`` is the bounded name a request counted as; ``rejected`` keeps a default so that
    one method also serves the proxy's ``ProxyEvents``."""

    def granted(self, host: str, lateness: float, pipeline: str) -> None:
        """A slot handed out, ``lateness`` seconds after its time."""

    def waited(self, host: str, klass: Klass, seconds: float, pipeline: str) -> None:
        """A request held ``seconds`` before it went upstream."""

    def throttled(self, host: str, code: int, delay: float) -> None:
        """A throttle answer (``code`` 0: a failure), and the backoff it set."""

    def rejected(self, host: str, reason: str, pipeline: str = DEFAULT_PIPELINE) -> None:
        """A request refused by the pacer (``reason``: "max_wait" or "queue_full")."""

    def line_changed(self, host: str, pipeline: str, depth: int) -> None:
        """The depth of one (host, pipeline) line of waiters now."""

    def exempt_changed(self, host: str, in_flight: int) -> None:
        """Exempt reads of ``host`` in flight now."""


NoPacerEvents = PacerEvents  # the family's own no-op methods: the sink that hears nothing


class RepeatLog:
    """One line per distinct error, then a count of its repeats at most once per ``every`` seconds.

    Errors differing only in numbers count as one; at most ``cap`` distinct errors are remembered. Every
    line is logged at ``level``. The first line of an error carries its traceback when ``tracebacks`` is
    on, except for the ``plain`` exceptions (a store that cannot answer is an expected fault: its message
    says enough). The counting is the one log limiter's (``policy.loglimit``, a burst of one)::

        errors = RepeatLog(log, time.monotonic, level=logging.WARNING, tracebacks=False)
        try:
            await refresh()
        except Exception as e:
            errors.error("gauge refresh failed", e)
    """

    def __init__(
        self,
        logger: logging.Logger,
        monotonic: Callable[[], float],
        every: float = 60.0,
        cap: int = 32,
        level: int = logging.ERROR,
        tracebacks: bool = True,
        plain: tuple[type[BaseException], ...] = (StoreError,),
    ) -> None:
        self.log = logger
        self.monotonic = monotonic
        self.level = level
        self.tracebacks = tracebacks
        self.plain = plain
        self._limit = LogLimiter(burst=1, window=every, max_keys=cap)

    def error(self, what: str, exc: BaseException) -> None:
        text = error_line(what, exc)
        v = self._limit.hit(error_key(text), self.monotonic())
        if v.new:
            trace = self.tracebacks and not isinstance(exc, self.plain)
            self.log.log(self.level, "%s", text, exc_info=exc if trace else None)
        elif v.log:  # this one and the repeats held since the last line
            self.log.log(self.level, "%s (%d more times in %.0fs)", text, v.held + 1, v.span)

    def recovered(self, what: str) -> None:
        if len(self._limit):
            repeats = self._limit.held()
            self.log.warning("%s: recovered (%d repeated errors not logged)", what, repeats)
            self._limit.clear()
