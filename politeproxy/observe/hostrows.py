"""One host's row of the status document: its state, why it is held, and its pace (issue 24 item 5).

A held host says why as every proxy on the store sees it (``policy.holds``): the answer, the server that
sent it, the rule applied, since and until when, and the next probe; a slowed host says how far its
interval was raised.
"""

from __future__ import annotations

import math
import time
from typing import Any

from politeproxy.pacing.pacer import PacerSnapshot
from politeproxy.policy.holds import HoldNote
from politeproxy.stores.base import HostView


def num(x: float | None, digits: int = 3) -> float | None:
    """A JSON-safe number: rounded, and None for anything not finite."""
    if x is None or not math.isfinite(x):
        return None
    return round(float(x), digits)


def host_state(view: HostView | None, local_ready_in: float) -> tuple[str, float, str]:
    """(state, seconds left, detail) of a host. ``view`` None: the store did not answer in time, and only
    this process's hint is known."""
    if view is None:
        return "unknown", local_ready_in, "the store did not answer; local hint only"
    if view.blocks > 0:
        if view.backoff_in > 0:
            return "blocked", view.backoff_in, f"block {view.blocks}: holding"
        if view.probe_in > 0:
            return "blocked", view.probe_in, "hold over: a probe is out"
        return "blocked", 0.0, "hold over: the next request is the probe"
    if view.backoff_in > 0:
        return "backing off", view.backoff_in, f"{view.throttles} throttles in a row"
    if view.adapt_interval > 0 and view.adapt_until_in > 0:
        return "slowed", view.adapt_until_in, f"interval raised to {view.adapt_interval:g}s after throttles"
    return "ok", 0.0, ""


def hold_row(note: HoldNote | None, view: HostView | None, state: str, now: float) -> dict[str, Any] | None:
    """Why a held host waits, as every proxy on the store sees it: the answer, who sent it, the rule,
    since and until when, the next probe; and a release, when one was made. None when nothing holds."""
    if note is None or (state == "ok" and not note.released_at):
        return None
    probe = None
    if view is not None and view.blocks > 0:
        probe = num(view.probe_in if view.probe_in > 0 else view.backoff_in, 1)
    return {
        "kind": note.kind,
        "status": note.status or None,
        "reason": note.reason,
        "rule": note.rule,
        "since": num(note.since, 1),
        "until": num(note.until, 1),
        "next_probe_in_s": probe,
        "seen_by": note.by,
        "released_at": num(note.released_at, 1) if note.released_at else None,
        "released_by": note.released_by or None,
    }


def _reason(local: str, note: HoldNote | None) -> str:
    """Why the host is held: what this proxy saw, else what the proxy that saw it noted in the store."""
    return local or (note.reason if note is not None else "")


def host_row(
    host: str, view: HostView | None, snap: PacerSnapshot, note: HoldNote | None = None
) -> dict[str, Any]:
    """The host's row: its state now (from the store's record), why (the note), and its pace."""
    s = snap.settings
    configured = s.interval_for(host)
    base = max(s.gap, configured)
    state, left, detail = host_state(view, snap.ready_in.get(host, 0.0))
    hold = hold_row(note, view, state, time.time())
    held = state in ("blocked", "backing off")
    return {
        "host": host,
        "state": state,
        "seconds_left": num(left, 1),
        "detail": detail,
        "reason": _reason(snap.reasons.get(host, ""), note) if held else "",
        "hold": hold,
        "effective_interval_s": num(view.interval(base) if view else base),
        "configured_interval_s": num(configured),
        "queued": snap.queued_by_host.get(host, 0),
        "exempt_in_flight": snap.exempt_in_flight.get(host, 0),
        "throttles": view.throttles if view else None,
    }
