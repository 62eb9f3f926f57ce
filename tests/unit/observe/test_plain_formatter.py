"""logs.PlainFormatter (the date text made once per second) against the stdlib's own output."""

from __future__ import annotations

import logging

from hypothesis import given
from hypothesis import strategies as st

from politeproxy.observe.logs import PLAIN_FORMAT, PlainFormatter


@given(created=st.floats(min_value=0, max_value=4e9, allow_nan=False), msg=st.text(max_size=20))
def test_plain_formatter_matches_the_stdlib_formatter(created: float, msg: str) -> None:
    record = logging.LogRecord("politeproxy.access", logging.INFO, __file__, 1, msg, None, None)
    record.created, record.msecs = created, (created - int(created)) * 1000
    ours, stdlib = PlainFormatter(), logging.Formatter(PLAIN_FORMAT)
    assert ours.format(record) == stdlib.format(record)
    record.created += 0.001  # the same second again: the cached text
    record.msecs = (record.created - int(record.created)) * 1000
    assert ours.format(record) == stdlib.format(record)
