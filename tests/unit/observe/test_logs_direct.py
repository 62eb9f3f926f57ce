"""The access lines the handler ``setup_logging`` makes writes itself: the same text as the record through
``logging`` gives, written at once and in order with every other line; with another handler listening,
the record goes through ``logging``."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from politeproxy.observe import logs
from politeproxy.observe.logs import AccessLog, DirectHandler, JsonFormatter, PlainFormatter
from politeproxy.policy.classify import Klass
from politeproxy.proxy.common.exchange import Exchange

REC = Exchange(
    "10.0.0.1", "GET", "data.commoncrawl.org", "/crawl-data/x.warc.gz", Klass.PACED, "etl", 0.41234, 200, 42,
    0.5, retries=1, note="client_gone", cache="miss",
)  # fmt: skip


@contextlib.contextmanager
def direct() -> Iterator[tuple[DirectHandler, io.StringIO]]:
    """The root logger with only a direct handler on a StringIO (as ``setup_logging`` leaves it). Entered
    in the test's body: pytest adds its capture handlers to the root for each phase."""
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    out = io.StringIO()
    h = DirectHandler(out, "plain")
    h.setFormatter(PlainFormatter())
    root.handlers[:] = [h]
    logs.access_log.setLevel(logging.INFO)
    try:
        yield h, out
    finally:
        h.flush()
        root.handlers[:] = saved
        root.setLevel(level)
        logs.access_log.setLevel(logging.NOTSET)


def through_logging(rec: Exchange, formatter: logging.Formatter) -> str:
    """The line the record gives through logging's own path (another handler listening)."""
    out = io.StringIO()
    h = logging.StreamHandler(out)
    h.setFormatter(formatter)
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers[:] = [h]
    logs.access_log.setLevel(logging.INFO)
    try:
        AccessLog().access(rec)
    finally:
        root.handlers[:] = saved
        logs.access_log.setLevel(logging.NOTSET)
    return out.getvalue()


def test_the_direct_line_is_the_line_logging_gives() -> None:
    with direct() as (_h, out):
        AccessLog().access(REC)  # no running loop: written at once
        mine = out.getvalue()
    theirs = through_logging(REC, PlainFormatter())
    # the same text but for the time stamp (made a moment apart)
    assert mine.split(" ", 2)[2] == theirs.split(" ", 2)[2], (mine, theirs)
    assert mine.endswith(" note=client_gone pipeline=etl cache=miss\n")


def test_the_json_line_has_the_same_fields_in_the_same_order() -> None:
    out = io.StringIO()
    h = DirectHandler(out, "json")
    h.line("politeproxy.access", "unused", REC)
    mine = json.loads(out.getvalue())
    theirs = json.loads(through_logging(REC, JsonFormatter()))
    assert abs(mine.pop("ts") - theirs.pop("ts")) < 5
    assert list(mine.items()) == list(theirs.items())


@settings(max_examples=100, deadline=None)
@given(
    st.text(max_size=30), st.sampled_from(["GET", "HEAD", "POST"]), st.floats(allow_nan=True),
    st.integers(-1, 999), st.one_of(st.none(), st.text(max_size=20)),
)  # fmt: skip
def test_any_record_gives_the_line_logging_gives(
    path: str, method: str, wait: float, status: int, note: str | None
) -> None:
    rec = Exchange("c", method, "h", path, Klass.EXEMPT, "p", wait, status, 1, wait, note=note)
    out = io.StringIO()
    DirectHandler(out, "plain").line("politeproxy.access", logs.ACCESS_FORMAT % logs.access_args(rec), rec)
    theirs = through_logging(rec, PlainFormatter())
    assert out.getvalue().split(" ", 2)[2] == theirs.split(" ", 2)[2]


async def test_lines_are_written_at_once_and_keep_their_order() -> None:
    with direct() as (_h, out):
        for i in range(3):
            AccessLog().access(REC)  # inside a running loop too: nothing waits for a later pass
            assert len(out.getvalue().splitlines()) == i + 1
        logging.getLogger("politeproxy.x").warning("after three")
        lines = out.getvalue().splitlines()
        assert len(lines) == 4 and lines[3].endswith("WARNING politeproxy.x: after three"), lines


async def test_another_handler_gets_the_record_through_logging(caplog: pytest.LogCaptureFixture) -> None:
    with direct() as (_h, out):
        logging.getLogger("politeproxy").addHandler(caplog.handler)
        try:
            AccessLog().access(REC)
        finally:
            logging.getLogger("politeproxy").removeHandler(caplog.handler)
        assert out.getvalue().count("politeproxy.access") == 1  # written by logging, through both
    (rec,) = [r for r in caplog.records if r.name == "politeproxy.access"]
    assert rec.__dict__["access"] is REC


def test_a_process_writes_its_access_line_to_stderr() -> None:
    code = (
        "import asyncio, logging\n"
        "from politeproxy.observe.logs import setup_logging, AccessLog\n"
        "from politeproxy.policy.classify import Klass\n"
        "from politeproxy.proxy.common.exchange import Exchange\n"
        "setup_logging(0, 'plain')\n"
        "async def main():\n"
        "    AccessLog().access(Exchange('c', 'GET', 'h', '/p', Klass.PACED, 'p'))\n"
        "asyncio.run(main())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("INFO politeproxy.access: c GET h/p paced") == 1, r.stderr
