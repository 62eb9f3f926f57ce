"""Why a host is held, as every proxy sharing a store can read it (policy core, no I/O).

The store's host record says *that* a host waits (backoff, block, probe); a ``HoldNote`` says *why*: the
answer that started it, the server that sent it, the rule applied, since and until when, and which proxy
saw it. A ``politeproxy release`` writes a note too (``released_at``), which every proxy reads within a
second to drop its own local hold. Notes are untrusted records (another proxy, a stray write): ``decode``
never raises, bounds every string and treats an odd number as absent.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

MAX_TEXT = 200  # characters kept of any text field: a note is a line on a status page
KINDS = ("block", "backoff", "failure", "released")

# The rule each kind applies, in the words the status page shows.
RULES = {
    "block": "a block: held for pacing.block_hold (doubling per block in a row), then one probe",
    "backoff": "a throttle: Retry-After when sent (capped by pacing.backoff_cap), else exponential backoff",
    "failure": "no answer: pacing.backoff_base, doubling; three in a row count as a block",
    "released": "released by hand (politeproxy release)",
}


@dataclass(frozen=True, slots=True)
class HoldNote:
    host: str
    kind: str  # one of KINDS
    reason: str = ""  # "403 from CloudFront (Server: CloudFront)"
    status: int = 0  # the answer's status code; 0 = no answer
    since: float = 0.0  # wall-clock time the hold started
    until: float = 0.0  # wall-clock time it ends (a block then waits for its probe)
    by: str = ""  # the proxy that saw the answer (host name and pid)
    released_at: float = 0.0  # a release, when one was asked for after ``since``
    released_by: str = ""

    @property
    def rule(self) -> str:
        return RULES.get(self.kind, "")

    def encode(self) -> dict[str, Any]:
        return asdict(self)


def _text(v: object) -> str:
    if not isinstance(v, str):
        return ""
    return "".join(ch if ch.isprintable() else "?" for ch in v[:MAX_TEXT])


def _time(v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return 0.0
    f = float(v)
    return f if math.isfinite(f) and 0.0 <= f < 1e11 else 0.0


def decode(raw: object) -> HoldNote | None:
    """A note from an untrusted mapping, or None when it is not one."""
    if not isinstance(raw, dict):
        return None
    host, kind = _text(raw.get("host")), _text(raw.get("kind"))
    if not host or kind not in KINDS:
        return None
    status = raw.get("status")
    code = status if isinstance(status, int) and not isinstance(status, bool) and 0 <= status < 1000 else 0
    return HoldNote(
        host=host,
        kind=kind,
        reason=_text(raw.get("reason")),
        status=code,
        since=_time(raw.get("since")),
        until=_time(raw.get("until")),
        by=_text(raw.get("by")),
        released_at=_time(raw.get("released_at")),
        released_by=_text(raw.get("released_by")),
    )


def released(note: HoldNote | None, host: str, at: float, who: str) -> HoldNote:
    """The note after a release at ``at`` by ``who``: the cause kept, so the page says what was lifted."""
    if note is None:
        return HoldNote(host, "released", since=at, until=at, released_at=at, released_by=_text(who))
    n = note
    return HoldNote(n.host, n.kind, n.reason, n.status, n.since, min(n.until, at), n.by, at, _text(who))


def kind_of(block: bool, status: int | None) -> str:
    if block:
        return "block"
    return "failure" if status is None else "backoff"
