"""The grant's wait (pacing/dispatcher.py ``_settled``): one future and one timer per held request (issue 44:
memory per held request), and never a cancelled ticket: not by its timeout, not by the waiting task's
cancellation (a ticket whose slot is reserved must stay)."""

from __future__ import annotations

import asyncio

import pytest

from politeproxy.pacing.dispatcher import _settled


async def test_settled_times_out_without_cancelling_the_ticket() -> None:
    ticket: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    assert await _settled(ticket, 0.01) is False
    assert not ticket.done() and not ticket._callbacks  # untouched, and no callback left on it
    ticket.set_result(1.0)
    assert await _settled(ticket, 0.01) is True


async def test_settled_wakes_when_the_ticket_is_done_and_survives_cancellation() -> None:
    loop = asyncio.get_running_loop()
    ticket: asyncio.Future[float] = loop.create_future()
    loop.call_later(0.01, ticket.set_result, 2.0)
    assert await asyncio.wait_for(_settled(ticket, 5.0), 2.0) is True  # woken by the ticket, not the timer
    other: asyncio.Future[float] = loop.create_future()
    waiting = loop.create_task(_settled(other, 5.0))
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not other.cancelled() and not other._callbacks  # the waiter's cancellation is not the ticket's
