"""The fair-queuing record of the file store: ``fair`` in the data dir, beside ccrawl's ``ratelimit.lock``
(whose 16 bytes stay ccrawl's alone), read and written under the same flock as the slot.

JSON: ``{"v": V, "f": {pipeline: finish}, "m": [[proxy, pipeline, expires], ...]}``, times in the file
store's clock (wall seconds). The record is untrusted (another process, a crash, a disk): decoding never
raises, a record that is not one reads as empty (fair shares restart; the budget is untouched: the slot
lives in ``ratelimit.lock``), and every value passes ``fairclaim.sane_state``.
"""

from __future__ import annotations

import json
import math
from typing import Any

from politeproxy.policy.fairclaim import MAX_MARKS, FairState
from politeproxy.policy.fairness import MAX_NAME

MAX_SIZE = 256 * 1024  # bytes read at most: MAX_MARKS marks of the longest names fit with room to spare


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    f = float(x)
    return f if math.isfinite(f) else None


def _name(x: Any, limit: int = MAX_NAME) -> str | None:
    return x if isinstance(x, str) and 0 < len(x) <= limit else None


def decode(data: bytes) -> tuple[FairState, bool]:
    """The state a record holds, and whether it was a well-formed record (empty is well formed)."""
    if not data:
        return FairState(), True
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return FairState(), False
    if not isinstance(doc, dict):
        return FairState(), False
    ok = True
    v = _num(doc.get("v", 0.0))
    if v is None:
        v, ok = 0.0, False
    s = FairState(v)
    raw_f, raw_m = doc.get("f", {}), doc.get("m", [])
    if not isinstance(raw_f, dict) or not isinstance(raw_m, list):
        return s, False
    for p, f in list(raw_f.items())[: MAX_MARKS + 1]:
        name, tag = _name(p), _num(f)
        if name is None or tag is None:
            ok = False
            continue
        s.finish[name] = tag
    for m in raw_m[: MAX_MARKS + 1]:
        if not (isinstance(m, list) and len(m) == 3):
            ok = False
            continue
        proxy, name, exp = _name(m[0], 32), _name(m[1]), _num(m[2])
        if proxy is None or name is None or exp is None:
            ok = False
            continue
        s.marks[(proxy, name)] = exp
    return s, ok


def encode(s: FairState) -> bytes:
    doc = {"v": s.vtime, "f": s.finish, "m": [[k[0], k[1], exp] for k, exp in s.marks.items()]}
    return json.dumps(doc, separators=(",", ":")).encode()
