"""policy.settings.format_utc: the one text of a wall-clock time in refusals, access lines and status
lines (the policy core reads no clock: it formats the time it is given), as time.strftime wrote it."""

from __future__ import annotations

import time

from hypothesis import given
from hypothesis import strategies as st

from politeproxy.policy.settings import format_utc


@given(st.floats(0, 4e9))
def test_format_utc_is_what_gmtime_gives(t: float) -> None:
    assert format_utc(t) == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
