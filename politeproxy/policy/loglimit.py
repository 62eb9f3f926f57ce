"""The one log-rate limiter (issue 23, item 7): per key, at most ``burst`` lines in a window; the rest are
counted and summed up when the key's next window opens.

The decision only (policy core: no clock, no logger): the caller passes the clock's reading and writes the
lines. Its users: ``pacing.base.RepeatLog`` (one line per distinct error, then its repeats counted once a
minute), ``proxy.responses.BurstLimitedLog`` (refusals and notices per client or host) and the operator
log's pool-full warning (``proxy.eventlog``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Verdict:
    """What to do with one event."""

    log: bool  # write this event's line
    new: bool = False  # the key was not remembered: its first event (or its first since it was forgotten)
    held: int = 0  # events of the key's previous window that were not logged: sum them up now
    span: float = 0.0  # seconds from the previous window's opening to now (0 when ``new``)


# The verdicts that carry no count are shared: an event inside an open window allocates nothing.
LOG = Verdict(True)
HOLD = Verdict(False)
NEW = Verdict(True, new=True)


@dataclass(slots=True)
class _Window:
    opened: float
    events: int = 1


class LogLimiter:
    """Per key, a window opens at the key's first event, and at its first event ``window`` seconds or more
    after the open window's opening. The first ``burst`` events of a window are logged, the rest held; the
    verdict that opens the next window carries how many were held. A clock reading before the window's
    opening, or NaN, opens a new window too: a broken clock never mutes a key for good.

    At most ``max_keys`` keys are remembered; the key whose window opened longest ago is forgotten first,
    with its count (keys are client-chosen: clients, hosts, error texts).
    """

    __slots__ = ("_keys", "burst", "max_keys", "window")

    def __init__(self, burst: int, window: float, max_keys: int) -> None:
        if burst < 1 or not window > 0 or max_keys < 1:
            raise ValueError(f"burst {burst}, window {window}, max_keys {max_keys}: each must be positive")
        self.burst = burst
        self.window = window
        self.max_keys = max_keys
        self._keys: dict[str, _Window] = {}  # in the order their windows opened

    def hit(self, key: str, now: float) -> Verdict:
        """Count one event of ``key`` at ``now`` (the caller's clock, in seconds)."""
        w = self._keys.get(key)
        if w is not None and 0 <= now - w.opened < self.window:
            w.events += 1
            return LOG if w.events <= self.burst else HOLD
        if w is None:
            verdict = NEW
        else:
            del self._keys[key]  # re-inserted last below
            verdict = Verdict(True, held=max(0, w.events - self.burst), span=now - w.opened)
        self._keys[key] = _Window(now)
        while len(self._keys) > self.max_keys:
            del self._keys[next(iter(self._keys))]
        return verdict

    def held(self) -> int:
        """Events held in the open windows of every remembered key (not yet summed up)."""
        return sum(max(0, w.events - self.burst) for w in self._keys.values())

    def clear(self) -> None:
        """Forget every key and its count."""
        self._keys.clear()

    def __len__(self) -> int:
        return len(self._keys)


def error_line(what: str, exc: BaseException) -> str:
    """``what: ExcType: message`` on one line, the message at most 300 characters."""
    return f"{what}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def error_key(line: str) -> str:
    """The key of an error line: errors differing only in numbers (ports, counts, ids) count as one."""
    return re.sub(r"\d+", "#", line)[:300]
