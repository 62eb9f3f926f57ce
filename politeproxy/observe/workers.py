"""The workers' private channel: each worker of ``politeproxy run --workers N`` answers its own /metrics and
/status on a Unix socket in a folder only this user can open, and the worker that a scrape reaches asks
every other one there (workermerge.py makes one answer of them).

The supervisor (commands/supervisor.py) names the folder, the worker's index and its restarts in
``POLITEPROXY_WORKER`` ("INDEX:COUNT:RESTARTS:FOLDER"); a proxy without it is the only worker and answers
alone, exactly as before. A peer that does not answer within ``ASK_TIMEOUT`` (restarting, or stuck) is
left out of that answer and shown as not answering; its body is read up to ``MAX_BODY``.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from politeproxy.observe.workermerge import merge_metrics, merge_status

ENV = "POLITEPROXY_WORKER"
ASK_TIMEOUT = 1.0  # seconds for one peer's answer
MAX_BODY = 32 << 20  # a peer's /metrics or /status, at most (a worker's text is tens of KiB)
Render = Callable[[], bytes]
Document = Callable[[], Awaitable[dict[str, Any]]]


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


async def serve_private(ws: WorkerSet, render: Render, status: Document | None) -> web.BaseRunner:
    """This worker's own /metrics and /status on its socket (never merged: no worker asks in a circle)."""

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
    runner = web.ServerRunner(web.Server(handler), access_log=None)
    await runner.setup()
    try:
        await web.UnixSite(runner, str(path)).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner
