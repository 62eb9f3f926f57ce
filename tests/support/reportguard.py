"""A pytest plugin (loaded by tests/conftest.py) that keeps one failing test from ending the whole run.

pytest formats a failure's traceback with ``tb_lineno - 1``. CPython 3.11 gives ``tb_lineno = None`` for a
frame stopped on an instruction that has no line number, so making the report raises TypeError inside
pytest. Under pytest-xdist that is an INTERNALERROR on the worker, which xdist does not replace: CI once
ended "1318 passed ... Unexpectedly no active workers available" with the failing test never named
(pytest-dev/pytest-xdist#1196). Here such a failure is reported as a plain failure with Python's own
traceback text instead.
"""

from __future__ import annotations

import traceback
from collections.abc import Generator
from typing import Any

import pytest


def plain_report(item: pytest.Item, call: pytest.CallInfo[Any], why: BaseException) -> pytest.TestReport:
    """A failed report whose text Python's traceback module writes (it copes with a missing line)."""
    lines: list[str] = []
    if call.excinfo is not None:
        lines += traceback.format_exception(call.excinfo.value)
    lines.append(f"\n(pytest could not format this traceback: {why!r}; Python's own text is above)\n")
    return pytest.TestReport(
        nodeid=item.nodeid,
        location=item.location,
        keywords={k: 1 for k in item.keywords},
        outcome="failed",
        longrepr="".join(lines),
        when=call.when,
        sections=[],
        duration=call.duration,
        start=call.start,
        stop=call.stop,
        user_properties=list(item.user_properties),
    )


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    try:
        return (yield)
    except Exception as e:  # TypeError from tb_lineno None; any other formatting bug alike
        if call.excinfo is None:  # not the failure-formatting case: a real bug, let pytest say so
            raise
        return plain_report(item, call, e)
