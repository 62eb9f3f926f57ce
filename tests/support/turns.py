"""Turns through the pacer's one door (``Pacer.permit``), for tests that only need the wait."""

from __future__ import annotations

from politeproxy.pacing.pacer import Pacer
from politeproxy.policy.classify import Klass


async def paced(pacer: Pacer, host: str, arrived: float | None = None, pipeline: str | None = None) -> float:
    """One paced turn: wait for the slot (or raise WaitTooLong), give nothing back; seconds held."""
    async with pacer.permit(host, Klass.PACED, arrived, pipeline) as p:
        return p.waited
