"""The workers' private channel: each worker of ``politeproxy run --workers N`` answers its own /metrics and
/status on a Unix socket in a folder only this user can open, and the worker that a scrape reaches asks
every other one there (workermerge.py makes one answer of them).

The supervisor (commands/supervisor.py) names the folder, the worker's index and its restarts in
``POLITEPROXY_WORKER`` ("INDEX:COUNT:RESTARTS:FOLDER"); a proxy without it is the only worker and answers
alone, exactly as before. A peer that does not answer within ``ASK_TIMEOUT`` (restarting, or stuck) is
left out of that answer and shown as not answering; its body is read up to ``MAX_BODY``.

A worker the supervisor restarts starts counting its grants from 0. So each worker writes its count to
``w<INDEX>.grants`` in the folder every ``CARRY_EVERY`` seconds, and its next life adds the grants of the
lives before it (``Board.carried``) to its count since start: the merged count keeps a dead worker's grants
(issue 42, item 11; at most ``CARRY_EVERY`` seconds of them are lost to a kill -9).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from politeproxy.observe.workermerge import merge_metrics, merge_status

ENV = "POLITEPROXY_WORKER"
ASK_TIMEOUT = 1.0  # seconds for one peer's answer
MAX_BODY = 32 << 20  # a peer's /metrics or /status, at most (a worker's text is tens of KiB)
CARRY_EVERY = 1.0  # seconds between writes of this worker's grant count
MAX_GRANTS = 1 << 62  # a count read back from the folder is bounded (the file is this user's, but a record)
Render = Callable[[], bytes]
Document = Callable[[], Awaitable[dict[str, Any]]]


class Board(Protocol):
    """The status board as the private channel uses it (observe/status.py's StatusBoard)."""

    carried: int  # grants of this worker index's earlier lives, in its count since start

    async def document(self) -> dict[str, Any]: ...

    def granted(self) -> int:
        """This life's grants so far."""
        ...


def read_carried(path: Path, pid: int) -> int:
    """The grants of the earlier lives of one worker index: what the last one wrote, its own count and the
    count it carried (0 when nothing readable was written)."""
    try:
        parts = path.read_text(encoding="ascii")[:100].split()
    except (OSError, UnicodeDecodeError):
        return 0
    if len(parts) != 3 or not all(p.isdigit() and len(p) < 20 for p in parts):
        return 0
    old_pid, grants, carried = (int(p) for p in parts)
    return min(MAX_GRANTS, carried if old_pid == pid else carried + grants)


def write_carried(path: Path, pid: int, grants: int, carried: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(f"{pid} {grants} {carried}\n", encoding="ascii")
    os.replace(tmp, path)  # whole or not at all: a restart never reads half a count


async def keep_carried(path: Path, board: Board) -> None:
    """Forever: this life's grant count to ``path`` (off the event loop); a write that fails is retried."""
    pid = os.getpid()
    while True:
        await asyncio.sleep(CARRY_EVERY)
        try:
            await asyncio.to_thread(write_carried, path, pid, board.granted(), board.carried)
        except OSError:
            pass  # the folder went away (the supervisor is stopping): nothing to keep


class _PrivateRunner(web.ServerRunner):
    """The private channel's runner; its cleanup stops the grant count's writer too."""

    writer: asyncio.Task[None] | None = None

    async def cleanup(self) -> None:
        if self.writer is not None:
            self.writer.cancel()
        await super().cleanup()


@dataclass(frozen=True, slots=True)
class WorkerSet:
    index: int
    count: int
    restarts: int
    folder: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> WorkerSet | None:
        """The worker this process is, from ``POLITEPROXY_WORKER``; None when it is unset or malformed."""
        raw = env.get(ENV, "")
        parts = raw.split(":", 3)
        if len(parts) != 4 or not all(p.isdigit() for p in parts[:3]) or not parts[3]:
            return None
        index, count, restarts = (int(p) for p in parts[:3])
        if not 0 <= index < count <= 1024:
            return None
        return cls(index, count, restarts, Path(parts[3]))

    def value(self) -> str:
        """The variable's value for this worker (the supervisor's side)."""
        return f"{self.index}:{self.count}:{self.restarts}:{self.folder}"

    def socket(self, index: int) -> Path:
        return self.folder / f"w{index}.sock"

    def identity(self) -> dict[str, Any]:
        return {"index": self.index, "pid": os.getpid(), "restarts": self.restarts}

    async def ask(self, path: str, own: bytes) -> list[tuple[int, bytes | None]]:
        """``path`` from every worker, this one's answer given: (index, body or None), in index order."""
        others = [i for i in range(self.count) if i != self.index]
        got = await asyncio.gather(*(self._ask_one(i, path) for i in others))
        answers = dict(zip(others, got, strict=True))
        answers[self.index] = own
        return [(i, answers[i]) for i in range(self.count)]

    async def _ask_one(self, index: int, path: str) -> bytes | None:
        try:
            async with asyncio.timeout(ASK_TIMEOUT):
                conn = aiohttp.UnixConnector(path=str(self.socket(index)))
                async with aiohttp.ClientSession(connector=conn) as s, s.get(f"http://worker{path}") as r:
                    body = await r.content.read(MAX_BODY + 1)
                    return body if r.status == 200 and len(body) <= MAX_BODY else None
        except (OSError, TimeoutError, aiohttp.ClientError):
            return None  # restarting, or not up yet: shown as not answering


def own_status(ws: WorkerSet, doc: dict[str, Any]) -> dict[str, Any]:
    return {"worker": ws.identity(), **doc}


async def merged_metrics(ws: WorkerSet, own: bytes) -> bytes:
    parts = await ws.ask("/metrics", own)
    return merge_metrics([(i, b.decode("utf-8", "replace") if b else None) for i, b in parts], ws.count)


async def merged_status(ws: WorkerSet, own: dict[str, Any]) -> dict[str, Any]:
    parts = await ws.ask("/status", json.dumps(own_status(ws, own)).encode())
    docs: list[tuple[int, dict[str, Any] | None]] = []
    for i, body in parts:
        try:
            doc = json.loads(body) if body else None
        except ValueError:
            doc = None
        docs.append((i, doc if isinstance(doc, dict) else None))
    merged = merge_status(docs)
    assert merged is not None  # this worker's own document is always there
    return merged


async def serve_private(ws: WorkerSet, render: Render, board: Board | None) -> web.BaseRunner:
    """This worker's own /metrics and /status on its socket (never merged: no worker asks in a circle)."""
    status = board.document if board is not None else None

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        if request.rel_url.path == "/metrics":
            return web.Response(body=render())
        if request.rel_url.path == "/status" and status is not None:
            return web.json_response(own_status(ws, await status()))
        return web.Response(status=404)

    path = ws.socket(ws.index)
    try:
        path.unlink()  # the socket of this worker's previous life
    except FileNotFoundError:
        pass
    runner = _PrivateRunner(web.Server(handler), access_log=None)
    if board is not None:
        carry = ws.folder / f"w{ws.index}.grants"
        board.carried = await asyncio.to_thread(read_carried, carry, os.getpid()) if ws.restarts else 0
        runner.writer = asyncio.get_running_loop().create_task(keep_carried(carry, board))
    await runner.setup()
    try:
        await web.UnixSite(runner, str(path)).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
