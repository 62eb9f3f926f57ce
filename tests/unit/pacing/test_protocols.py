"""The event families match their calls (issue 23): every PacerEvents sink has the family's own
signatures, StatusEvents passes every event on to the sink it stands in for, and permit.py and
snapshot.py import nothing of pacer.py (no import circle, not even under TYPE_CHECKING)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import politeproxy.pacing
from politeproxy.cache.base import CacheEvents
from politeproxy.observe.metrics import Metrics
from politeproxy.observe.status import StatusEvents
from politeproxy.pacing import dispatcher
from politeproxy.pacing.base import NoPacerEvents, PacerEvents
from politeproxy.policy.classify import Klass
from politeproxy.proxy.common.events import ProxyEvents

PACING = Path(politeproxy.pacing.__file__).parent


def members(protocol: type) -> list[str]:
    return [n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")]


def shape(fn: object) -> list[tuple[str, object, object, object]]:
    """Parameters past self: name, kind, default, annotation (a string: every module defers them)."""
    params = list(inspect.signature(fn).parameters.values())[1:]  # type: ignore[arg-type]
    return [(p.name, p.kind, p.default, p.annotation) for p in params]


@pytest.mark.parametrize("sink", [Metrics, StatusEvents, NoPacerEvents])
@pytest.mark.parametrize("name", members(PacerEvents))
def test_every_pacer_sink_has_the_protocols_signatures(sink: type, name: str) -> None:
    assert shape(getattr(sink, name)) == shape(getattr(PacerEvents, name)), (sink.__name__, name)


# A value of each annotation the events take (every module defers its annotations: they are strings).
SAMPLES: dict[object, object] = {
    "str": "data.commoncrawl.org", "int": 3, "float": 0.5, "int | None": 200, "Klass": Klass.PACED,
    "Exchange": object(),
}  # fmt: skip


@pytest.mark.parametrize("protocol", [PacerEvents, ProxyEvents, CacheEvents])
def test_status_events_stands_in_for_every_event(protocol: type) -> None:
    """Every event of the three families reaches the sink through StatusEvents, with its arguments (issue
    44: each event is declared once, on its family; nothing spells it out again to pass it on)."""
    assert "__getattr__" not in vars(StatusEvents)
    for name in members(protocol):
        heard: list[tuple[object, ...]] = []
        sink = protocol()
        setattr(sink, name, lambda *args, heard=heard: heard.append(args))
        args = tuple(
            SAMPLES[p.annotation]
            for p in list(inspect.signature(getattr(protocol, name)).parameters.values())[1:]
        )
        getattr(StatusEvents(sink), name)(*args)
        assert heard == [args], name


def test_no_pipeline_shim_is_left() -> None:
    assert not hasattr(dispatcher, "Report")
    assert not any(hasattr(c, "labels_pipelines") for c in (Metrics, StatusEvents, NoPacerEvents))


def imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("module", ["permit.py", "snapshot.py", "state.py", "dispatcher.py", "base.py"])
def test_the_pacers_parts_do_not_import_the_pacer(module: str) -> None:
    assert "politeproxy.pacing.pacer" not in imports(PACING / module)
