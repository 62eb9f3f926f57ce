"""The event Protocols match their calls (issue 23): every PacerEvents sink has the Protocol's own
signatures, StatusEvents spells out every method it stands in for, and permit.py and snapshot.py import
nothing of pacer.py (no import circle, not even under TYPE_CHECKING)."""

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
from politeproxy.proxy.events import ProxyEvents

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


@pytest.mark.parametrize("protocol", [PacerEvents, ProxyEvents, CacheEvents])
def test_status_events_spells_out_what_it_stands_in_for(protocol: type) -> None:
    assert "__getattr__" not in vars(StatusEvents)
    for name in members(protocol):
        assert name in vars(StatusEvents), name
        assert shape(getattr(StatusEvents, name)) == shape(getattr(protocol, name)) or name == "rejected"


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
