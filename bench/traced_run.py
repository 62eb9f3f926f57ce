"""``python -m bench.traced_run run ...``: politeproxy's own command line, accounted, for ``bench/held.py
--tracemalloc`` and ``--smaps``. Each SIGUSR2 takes a snapshot: the first is the base; every later one writes
what grew beyond the base.

- Under tracemalloc (one frame; ``$POLITEPROXY_TRACEMALLOC`` not ``0``): what the Python allocators hold
  beyond the base, by line, to ``$POLITEPROXY_TRACE_OUT`` (lines of "bytes allocations file:line",
  biggest first). tracemalloc sees what Python allocates (objects, and buffers made through it, such as a
  bytearray, whether or not their pages are ever touched); OpenSSL's own allocations and malloc's slack it
  does not see.
- Always: the process's memory accounts, as JSON lines to ``$POLITEPROXY_TRACE_OUT`` + ``.mem`` (one a
  snapshot, the base first): the resident set from /proc/self/status, glibc's ``mallinfo2`` (heap bytes
  taken from the system, in use, free; bytes in mmapped chunks) and pymalloc's arenas (1 MiB each, mapped
  by Python itself, outside malloc). Those show where the RSS a held request costs sits: Python's small
  objects, malloc's heap (OpenSSL and Python's larger buffers) and its free slack, or big mmapped chunks.
  With ``$POLITEPROXY_TRACE_TRIM=1``, every snapshot after the base then calls glibc's ``malloc_trim(0)``
  and adds the RSS after it (``VmRSS_after_trim``): how much of the slack is whole free pages.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import signal
import sys
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _status_kib() -> dict[str, int]:
    got: dict[str, int] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmData"):
            got[key] = int(rest.split()[0])
    return got


def _pymalloc() -> dict[str, int]:
    """pymalloc's arenas now and the bytes in their allocated blocks (sys._debugmallocstats, from fd 2)."""
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        try:
            os.dup2(f.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode(errors="replace")

    def num(label: str) -> int:
        m = re.search(re.escape(label) + r"\s*=\s*([\d,]+)", text)
        return int(m.group(1).replace(",", "")) if m else 0

    return {
        "pymalloc_arena_bytes": num("# arenas allocated current") * 1024 * 1024,
        "pymalloc_used_bytes": num("# bytes in allocated blocks"),
    }


def accounts() -> dict[str, int]:
    """The process's memory accounts now (bytes; the /proc figures in KiB * 1024)."""
    got = {k: v * 1024 for k, v in _status_kib().items()}
    try:
        info = ctypes.CDLL(None).mallinfo2
        info.restype = _MallInfo2
        m = info()
        got |= {
            "malloc_heap": m.arena,
            "malloc_used": m.uordblks,
            "malloc_free": m.fordblks,
            "malloc_mmapped": m.hblkhd,
            "malloc_mmapped_chunks": m.hblks,
        }
    except (OSError, AttributeError):  # not glibc >= 2.33
        pass
    return got | _pymalloc()


def _snapshots(out: Path, traced: bool) -> Callable[[int, FrameType | None], None]:
    base: list[tracemalloc.Snapshot] = []
    mem = out.with_name(out.name + ".mem")

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        got = accounts()
        if os.environ.get("POLITEPROXY_TRACE_TRIM") == "1" and mem.exists():  # not at the base
            ctypes.CDLL(None).malloc_trim(0)
            got["VmRSS_after_trim"] = _status_kib()["VmRSS"] * 1024
        with mem.open("a") as f:
            f.write(json.dumps(got) + "\n")
        if not traced:
            return
        snap = tracemalloc.take_snapshot()
        if not base:
            base.append(snap)
            return
        stats = snap.compare_to(base[0], "lineno")
        lines = [
            f"{s.size_diff} {s.count_diff} {s.traceback[0].filename}:{s.traceback[0].lineno}"
            for s in stats
            if s.size_diff > 0
        ]
        tmp = out.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(out)

    return on_signal


def main() -> int:
    traced = os.environ.get("POLITEPROXY_TRACEMALLOC", "1") != "0"
    if traced:
        tracemalloc.start(1)
    signal.signal(signal.SIGUSR2, _snapshots(Path(os.environ["POLITEPROXY_TRACE_OUT"]), traced))
    from politeproxy.commands.cli import main as cli

    return cli()


if __name__ == "__main__":
    raise SystemExit(main())
