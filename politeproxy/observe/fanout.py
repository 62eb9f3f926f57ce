"""One sink of an event family from several: each event reaches every sink that hears it.

An event is declared once, as a method that does nothing on its family (``proxy.events.ProxyEvents``,
``pacing.base.PacerEvents``, ``cache.base.CacheEvents``); a sink subclasses the families it hears and
overrides the events it wants. ``fan_out`` reads the family's methods, so a new event needs no edit here.
Per event, a sink that does not override it is left out, and when one sink is left its bound method is
set on the joined object directly: the per-request events then cost one call each, as a single sink.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from politeproxy.cache.base import CacheEvents
from politeproxy.pacing.base import PacerEvents
from politeproxy.proxy.common.events import ProxyEvents

FAMILIES: tuple[type, ...] = (ProxyEvents, PacerEvents, CacheEvents)
E = TypeVar("E")
Call = Callable[..., None]


def events_of(family: type) -> list[str]:
    """The events a family declares: its public methods, in declaration order."""
    return [n for n, v in vars(family).items() if callable(v) and not n.startswith("_")]


def hears(sink: object, name: str, families: tuple[type, ...] = FAMILIES) -> bool:
    """Does ``sink`` override event ``name``? Not when the method it has is a family's own no-op (one of
    ``FAMILIES`` or of ``families``)."""
    if name in getattr(sink, "__dict__", ()):  # set on the object itself: a joined sink (join_into)
        return True
    for klass in type(sink).__mro__:
        if name in vars(klass):
            return klass not in FAMILIES and klass not in families
    return False


def _each(calls: list[Call]) -> Call:
    if len(calls) == 2:  # the usual case (metrics and the status tallies): no loop
        first, second = calls

        def both(*args: Any, **kw: Any) -> None:
            first(*args, **kw)
            second(*args, **kw)

        return both

    def every(*args: Any, **kw: Any) -> None:
        for call in calls:
            call(*args, **kw)

    return every


def join_into(target: object, families: tuple[type, ...], sinks: tuple[object, ...]) -> None:
    """Set on ``target`` each event of ``families`` as the calls of the ``sinks`` that hear it (an event
    none hears keeps ``target``'s own method). Every sink's methods are read before any is set, so
    ``target`` may be one of the sinks."""
    joined: dict[str, Call] = {}
    for family in families:
        for name in events_of(family):
            live = [getattr(s, name) for s in sinks if hears(s, name, families)]
            if len(live) == 1:
                joined[name] = live[0]
            elif live:
                joined[name] = _each(live)
    for name, call in joined.items():
        setattr(target, name, call)


def fan_out(family: type[E], *sinks: E) -> E:
    """A ``family`` object whose every event goes to each of ``sinks`` that hears it, in order."""
    out = family()
    join_into(out, (family,), sinks)
    return out
