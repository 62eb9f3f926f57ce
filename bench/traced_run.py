"""``python -m bench.traced_run run ...``: politeproxy's own command line under tracemalloc (one frame), for
``bench/held.py --tracemalloc``. Each SIGUSR2 takes a snapshot: the first is the base; every later one
writes what the Python allocators hold beyond the base, by file, to ``$POLITEPROXY_TRACE_OUT`` (lines of
"bytes allocations file", biggest first). tracemalloc sees what Python allocates (objects, and buffers made
through it, such as a bytearray, whether or not their pages are ever touched); OpenSSL's own allocations
and malloc's slack it does not see.
"""

from __future__ import annotations

import os
import signal
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import FrameType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _snapshots(out: Path) -> Callable[[int, FrameType | None], None]:
    base: list[tracemalloc.Snapshot] = []

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        snap = tracemalloc.take_snapshot()
        if not base:
            base.append(snap)
            return
        stats = snap.compare_to(base[0], "filename")
        lines = [f"{s.size_diff} {s.count_diff} {s.traceback[0].filename}" for s in stats if s.size_diff > 0]
        tmp = out.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(out)

    return on_signal


def main() -> int:
    tracemalloc.start(1)
    signal.signal(signal.SIGUSR2, _snapshots(Path(os.environ["POLITEPROXY_TRACE_OUT"])))
    from politeproxy.commands.cli import main as cli

    return cli()


if __name__ == "__main__":
    raise SystemExit(main())
