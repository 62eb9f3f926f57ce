"""Virtual time for timing tests: the test's event loop fast-forwards its clock (the ``looptime`` library).

A test that requests ``vclock`` runs on a loop whose ``time()`` only moves when every task waits: then it
jumps to the next timer. ``asyncio.sleep``, ``asyncio.timeout`` and the pacer's own clock therefore agree,
a 30 s backoff takes microseconds of real time, and times are exact (``==``, not tolerances)::

    from tests.support.virtual_clock import VirtualClock, vclock_fixture  # noqa: F401 - the fixture

    async def test_slots(vclock: VirtualClock) -> None:
        store = MemoryStore(clock=vclock, rand=lambda: 0.0)
        pacer = Pacer(store, settings, monotonic=vclock)

Rules that keep the times exact:

- gaps and waits are binary fractions of at least 1/64 s (0.25, 0.125, 1.5): every slot ``T0 + k * gap``
  is then exact in floating point and in looptime's whole microseconds, so no grant drifts by an ulp (the
  dispatcher sleeps a further millisecond when its slot is an ulp ahead of the clock);
- fixtures run on the real clock (looptime turns virtual time on for the test body only): close pacers
  and stores in the test body where their teardown would wait on a timer;
- a loop with nothing scheduled and nothing to read fails the test after ``IDLE_TIMEOUT`` real seconds
  (``looptime.IdleTimeoutError``): a deadlock, not a hang until pytest-timeout.

looptime's pytest plugin patches every pytest-asyncio loop when it is created and turns virtual time on
only for tests marked ``looptime`` (the fixture adds the mark); every other test keeps the real clock.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from looptime import LoopTimeEventLoop

T0 = 1000.0  # virtual start: ahead of any time the loop counted in fixtures (moving back would warn)
IDLE_TIMEOUT = 0.1  # real seconds an idle loop (no timer, no I/O) waits before it fails the test
OPTIONS: dict[str, Any] = {"start": T0, "idle_timeout": IDLE_TIMEOUT}

virtual_time = pytest.mark.looptime(**OPTIONS)


class VirtualClock:
    """The running loop's clock, as a ``Callable[[], float]`` for ``Pacer(monotonic=)`` and stores'
    ``clock=``; ``busy`` holds the loop without running anything (a loop that was busy elsewhere)."""

    def __call__(self) -> float:
        return asyncio.get_running_loop().time()

    @staticmethod
    def loop() -> LoopTimeEventLoop:
        loop = asyncio.get_running_loop()
        if not isinstance(loop, LoopTimeEventLoop) or not loop.looptime_on:
            raise RuntimeError("virtual time is off for this test (--no-looptime, or no looptime plugin)")
        return loop

    def busy(self, seconds: float) -> None:
        """The loop is blocked for ``seconds``: its clock moves on and no callback runs meanwhile, so every
        timer due in that time fires late. Call it from a task or a callback, without awaiting."""
        loop = self.loop()
        # looptime has no public "advance": setup_looptime (what its plugin calls before each test) sets a
        # later start; it resets every option, so they are passed again. It also forgets the executor
        # futures it tracks: busy() is for tests that run no thread.
        loop.setup_looptime(**{**OPTIONS, "start": loop.time() + seconds})


@pytest.fixture(name="vclock")  # a test module imports ``vclock_fixture``; its tests take ``vclock``
def vclock_fixture(request: pytest.FixtureRequest) -> VirtualClock:
    """The virtual clock; requesting it (directly or through another fixture) turns virtual time on."""
    request.applymarker(virtual_time)
    return VirtualClock()
