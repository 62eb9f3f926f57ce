"""The access line is the forwarder's Exchange, rendered by logs.py, plain or JSON."""

from __future__ import annotations

import io
import json
import logging

from politeproxy.observe.logs import PLAIN_FORMAT, JsonFormatter
from politeproxy.policy.classify import Klass
from politeproxy.proxy.common.exchange import Exchange
from tests.support.access_lines import render

REC = Exchange(
    "10.0.0.1", "GET", "data.commoncrawl.org", "/x", Klass.PACED, "default", 0.12345, 200, 42, 0.56789
)


def test_plain_line() -> None:
    line = render(logging.Formatter(PLAIN_FORMAT), REC)
    assert line.endswith(
        "10.0.0.1 GET data.commoncrawl.org/x paced wait=0.123s status=200 bytes=42 duration=0.568s"
        " retries=0 pipeline=default"
    ), line


def test_json_line_is_flat_and_rounded() -> None:
    obj = json.loads(render(JsonFormatter(), REC))
    assert {k: obj[k] for k in obj if k not in ("ts", "logger")} == {
        "level": "info",
        "client": "10.0.0.1",
        "method": "GET",
        "host": "data.commoncrawl.org",
        "path": "/x",
        "class": "paced",
        "wait": 0.1235,
        "status": 200,
        "bytes": 42,
        "duration": 0.5679,
        "pipeline": "default",
        "retries": 0,
    }


def test_note_in_both_forms() -> None:
    rec = Exchange("?", "GET", "h", "/", Klass.PACED, "etl", 0.0, 0, 0, 1.0, note="client_gone")
    assert render(logging.Formatter(PLAIN_FORMAT), rec).endswith(" retries=0 note=client_gone pipeline=etl")
    assert json.loads(render(JsonFormatter(), rec))["note"] == "client_gone"


def test_a_message_that_looks_like_json_stays_a_message() -> None:
    """Before logs.py, any access message starting with "{" was parsed and merged; now only a record is."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("politeproxy.access.testmsg")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.warning('{"status": 999}')
    obj = json.loads(out.getvalue())
    assert obj["message"] == '{"status": 999}' and "status" not in obj
