"""Holds.release (issue 42, item 4): only a host the store holds is released, and one host at most once per
RELEASE_GAP from any proxy on the store; a refusal writes nothing. On a fake clock, with the memory store."""

from __future__ import annotations

import asyncio

from politeproxy.pacing.holding import NOTE_SETTLE, RELEASE_GAP, Holds
from politeproxy.pacing.rest import RestNotes
from politeproxy.pacing.state import QueueState
from politeproxy.stores.holdnotes import HoldNote, MemoryNotes
from politeproxy.stores.memory import MemoryStore
from tests.support.store_helpers import NOJITTER, Clock, H


def holds(clock: Clock, notes: MemoryNotes | None = None) -> tuple[Holds, MemoryStore, MemoryNotes]:
    store, notes = MemoryStore(clock=clock), notes or MemoryNotes()
    state: QueueState[asyncio.Future[float]] = QueueState()
    return Holds(store, state, RestNotes(64, clock), clock, notes, clock=clock), store, notes


async def test_releases_of_made_up_host_names_left_a_file_each_in_holds() -> None:
    clock = Clock()
    h, _store, notes = holds(clock)
    for i in range(50):
        r = await h.release(f"made-up-{i}.example", "test")
        assert r.hosts == () and "not held" in r.refused and r.retry_in == 0
    r = await h.release(H, "test")  # paced, but nothing holds it
    assert r.hosts == () and "not held" in r.refused
    assert await notes.get_quietly([H, "made-up-0.example"]) == {}  # nothing was written


async def test_a_release_every_tenth_of_a_second_let_one_request_through_per_release() -> None:
    clock = Clock()
    h, store, _notes = holds(clock)
    await store.throttled(H, 60.0, NOJITTER)
    first = await h.release(H, "test")
    assert first.hosts == (H,) and not first.refused
    assert (await store.host_view(H)).backoff_in == 0
    await store.throttled(H, 60.0, NOJITTER)  # the next request met the block again
    for step in range(1, int(RELEASE_GAP * 10)):  # every 0.1 s for RELEASE_GAP seconds: all refused
        clock.t += 0.1
        r = await h.release(H, "test")
        assert r.hosts == () and r.retry_in > 0 and "ago" in r.refused, (step, r)
    assert (await store.host_view(H)).backoff_in > 0  # still held
    clock.t += 0.2  # RELEASE_GAP since the first: one more release
    again = await h.release(H, "test")
    assert again.hosts == (H,) and not again.refused


class SlowNotes(MemoryNotes):
    """Notes whose writes take ``delay`` s: a loaded box's sidecar file, a slow Redis."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def put(self, note: HoldNote) -> None:
        await asyncio.sleep(self.delay)
        await super().put(note)


async def test_a_hold_just_noted_shows_in_the_view_and_a_release_is_not_undone_by_it() -> None:
    clock = Clock()
    h, store, _notes = holds(clock, SlowNotes(0.05))
    await store.throttled(H, 60.0, NOJITTER)
    h.held(H, True, 403, 60.0, "CloudFront 403")
    assert (await h.view([H]))[H].kind == "block"  # the write still under way is waited for
    h.held(H, True, 403, 60.0, "CloudFront 403")  # noted again just before the release
    assert (await h.release(H, "test")).hosts == (H,)
    await asyncio.sleep(0.1)
    assert (await h.view([H]))[H].released_at > 0  # the hold's late write did not land after the release's


async def test_a_note_that_never_finishes_holds_the_view_up_only_briefly() -> None:
    clock = Clock()
    h, _store, _notes = holds(clock, SlowNotes(3600.0))
    h.held(H, True, 403, 60.0, "CloudFront 403")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await h.view([H]) == {}
    assert loop.time() - t0 < NOTE_SETTLE + 0.5
    for task in asyncio.all_tasks() - {asyncio.current_task()}:
        task.cancel()  # the write that never ends
