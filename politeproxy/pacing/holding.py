"""Holds a person can see and lift (issue 24 item 5), for the pacer.

``Holds`` writes a note (``policy.holds``) each time the pacer records a block, throttle or failure, so
every proxy sharing the store can say why a host waits, since and until when. ``release`` lifts a hold in
the store and writes the release into the host's note; ``watch`` runs in every proxy and, once a second,
reads the notes of the hosts this proxy holds locally: a release made anywhere drops the local hold (the
ready hint, the refusal note, the fallback store's mirror) within a second.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from politeproxy.pacing.rest import RestNotes
from politeproxy.pacing.state import HINT_CAP, QueueState
from politeproxy.policy.backoff import Kind
from politeproxy.policy.holds import HoldNote, kind_of, released
from politeproxy.policy.services import service_key
from politeproxy.policy.window import WindowRule
from politeproxy.stores.base import Store
from politeproxy.stores.holdnotes import HoldNotes, MemoryNotes

log = logging.getLogger("politeproxy.pacing.holds")

WATCH_EVERY = 0.5  # seconds between looks for a release made by another proxy (the promise is 1 s)
LEARN_EVERY = 1.0  # seconds between reads of one host's note for the text of a refusal
LEARN_TIMEOUT = 0.2  # a refusal waits this long at most for the note; then it goes with the pacer's words
NOTE_SETTLE = 1.0  # seconds /status and release wait at most for this proxy's own notes to be written
# Seconds between two releases of one host, from any proxy on the store (issue 42, item 4): a process that
# asks every 0.1 s lets one request reach a blocking host per release, so at most 3 in 30 s, not 118.
RELEASE_GAP = 10.0


def proxy_name() -> str:
    """Who saw an answer or asked for a release: this machine and process."""
    return f"{socket.gethostname()[:64]}:{os.getpid()}"


@dataclass(frozen=True, slots=True)
class Released:
    """What a release did: the hosts whose records were cleared, and who asked."""

    hosts: tuple[str, ...]
    by: str
    at: float
    was: tuple[HoldNote, ...]
    refused: str = ""  # why nothing was released ("" when it was): the host is not held, or too soon
    retry_in: float = 0.0  # with a refusal for too soon: seconds until a release may be asked again


class Holds:
    def __init__(
        self,
        store: Store,
        state: QueueState[asyncio.Future[float]],
        rest: RestNotes,
        monotonic: Callable[[], float],
        notes: HoldNotes | None = None,
        clock: Callable[[], float] = time.time,
        wake: Callable[[], None] = lambda: None,
    ) -> None:
        self.store = store
        self.state = state
        self.rest = rest
        self.monotonic = monotonic
        self.notes: HoldNotes = notes or MemoryNotes()
        self.clock = clock
        self.name = proxy_name()
        self._since: dict[str, float] = {}  # host -> when this proxy last held it (wall clock), bounded
        self._seen: dict[str, float] = {}  # host -> the release this proxy last acted on, bounded
        self._learned: dict[str, float] = {}  # host -> when its note was last read for a refusal, bounded
        self._released: dict[str, float] = {}  # host -> when this proxy last released it, bounded
        self.wake = wake  # the dispatcher sleeps until the soonest hint: a dropped hint must wake it
        self._tasks: set[asyncio.Task[None]] = set()

    def held(self, host: str, block: bool, status: int | None, seconds: float, reason: str) -> None:
        """The pacer recorded a hold: note it for every proxy (in a task: a note is never in the way)."""
        now = self.clock()
        self._since.pop(host, None)
        self._since[host] = now
        while len(self._since) > HINT_CAP:
            del self._since[next(iter(self._since))]
        note = HoldNote(host, kind_of(block, status), reason, status or 0, now, now + seconds, self.name)
        task = asyncio.get_running_loop().create_task(self.notes.put_quietly(note))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def release(self, host: str, who: str) -> Released:
        """Lift ``host``'s hold (and its service's record, where the bucket's ceiling lives) for every
        proxy on the store; raise StoreError when the store cannot be read or written.

        Only a host the store holds is released (nothing is written for any other name), and one host at
        most once per ``RELEASE_GAP`` seconds, counted from the last release any proxy noted."""
        hosts = tuple(dict.fromkeys((host, service_key(host))))
        await self._settled()  # a hold note still being written would land after the release's, undoing it
        before = await self.notes.get_quietly(hosts)
        at = self.clock()
        last = max([n.released_at for n in before.values()] + [self._released.get(h, 0.0) for h in hosts])
        if 0.0 <= at - last < RELEASE_GAP:
            wait = RELEASE_GAP - (at - last)
            return Released(
                (), who, at, (), f"released {at - last:.1f}s ago; once per {RELEASE_GAP:g}s", wait
            )
        if not [h for h in hosts if await self._holds(h)]:
            return Released((), who, at, (), f"{host} is not held")
        for h in hosts:
            self._released.pop(h, None)
            self._released[h] = at
        while len(self._released) > HINT_CAP:
            del self._released[next(iter(self._released))]
        for h in hosts:
            await self.store.release(h)
        for h in hosts:
            await self.notes.put_quietly(released(before.get(h), h, at, who))
            self._drop_local(h)
        log.warning("released %s by hand (asked by %s)", ", ".join(hosts), who)
        return Released(hosts, who, at, tuple(before.values()))

    async def _holds(self, host: str) -> bool:
        """Whether ``host`` is held now: a backoff, a block or its probe in the store, or a rest of its
        exempt reads here (a host that only waits out its interval is not held)."""
        v = await self.store.host_view(host)
        return v.backoff_in > 0 or v.blocks > 0 or v.probe_in > 0 or bool(self.rest.note(host))

    async def view(self, hosts: Iterable[str]) -> dict[str, HoldNote]:
        """The hosts' notes, this proxy's own included: a hold it has just recorded shows with its reason."""
        await self._settled()
        return await self.notes.get_quietly(hosts)

    async def _settled(self) -> None:
        """Wait, at most NOTE_SETTLE s, for this proxy's notes still being written (a loaded box or a slow
        store can keep one a while): read-your-writes for /status and release, bounded as every wait is."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=NOTE_SETTLE)

    async def windows(self, rules: Iterable[WindowRule]) -> list[tuple[WindowRule, int]]:
        """Each window's requests now (reserved slots included); a store fault leaves a window out."""
        out: list[tuple[WindowRule, int]] = []
        for rule in rules:
            try:
                out.append((rule, await self.store.window_used(rule)))
            except Exception as e:  # noqa: BLE001 - a view never fails the page
                log.debug("reading the window of %s failed: %r", rule.service, e)
        return out

    def _drop_local(self, host: str) -> None:
        now = self.monotonic()
        if host in self.state.ready:
            self.state.set_ready(host, now, now)
        self.rest.forget(host)
        self._since.pop(host, None)
        self.wake()

    async def watch(self) -> None:
        """Forever: drop local holds that were released elsewhere (bounded reads: held hosts only)."""
        while True:
            await asyncio.sleep(WATCH_EVERY)
            try:
                await self.look()
            except Exception as e:  # noqa: BLE001 - the watch must outlive a store fault
                log.debug("looking for releases failed: %r", e)

    async def look(self) -> None:
        """Hosts held here (a hold this proxy recorded, or a ready hint from the store's answer) whose note
        holds a release this proxy has not acted on: dropped."""
        now = self.monotonic()
        held = {h for h in self._since if self.rest.note(h)}
        held |= {h for h, t in self.state.ready.items() if t > now + WATCH_EVERY}
        if not held:
            return
        for host, note in (await self.notes.get_quietly(sorted(held))).items():
            self._adopt(host, note)
            last = max(self._since.get(host, 0.0), self._seen.get(host, 0.0))
            if note.released_at > last:
                self._seen.pop(host, None)
                self._seen[host] = note.released_at
                while len(self._seen) > HINT_CAP:
                    del self._seen[next(iter(self._seen))]
                await self.store.release(host)  # this proxy's fallback mirror too; the shared record is clear
                self._drop_local(host)
                log.info("%s: released by %s; the local hold is dropped", host, note.released_by or "hand")

    async def learn(self, host: str) -> str:
        """Why ``host`` rests, from its note, when another proxy or worker held it (read at most once a
        LEARN_EVERY per host: a client retrying refusals in a loop costs the store nothing more)."""
        now = self.monotonic()
        if now - self._learned.get(host, -LEARN_EVERY) < LEARN_EVERY:
            return ""
        self._learned.pop(host, None)
        self._learned[host] = now
        while len(self._learned) > HINT_CAP:
            del self._learned[next(iter(self._learned))]
        try:
            async with asyncio.timeout(LEARN_TIMEOUT):
                found = await self.notes.get_quietly([host])
        except TimeoutError:
            return ""
        note = found.get(host)
        if note is not None:
            self._adopt(host, note)
        return self.rest.note(host)

    def _adopt(self, host: str, note: HoldNote) -> None:
        """A live hold another proxy (or worker) noted, that this one only knows from the store's answer:
        its refusals then say what the noting proxy's say (the cause, since and until when; issue 41)."""
        if note.kind not in ("block", "backoff", "failure") or note.released_at >= note.since:
            return
        if note.until <= self.clock() or self.rest.until(host) >= note.until:
            return
        kind = Kind.BLOCK if note.kind == "block" else Kind.THROTTLE
        self.rest.adopt(host, kind, note.since, note.until, note.reason)

    async def close(self) -> None:
        await self._settled()
