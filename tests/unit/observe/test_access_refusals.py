"""The access log sums refusals (issue 41): per cause, host and pipeline, the first refusal of each 30 s
has its line, and the next line sums up the ones held, in the plain and the JSON form."""

from __future__ import annotations

import json
import logging

from politeproxy.observe.logs import PLAIN_FORMAT, AccessLog, JsonFormatter
from politeproxy.policy.classify import Klass
from politeproxy.proxy.common.exchange import Exchange


def refused(note: str = "max_wait", pipeline: str = "etl") -> Exchange:
    return Exchange(
        "10.0.0.1", "GET", "data.commoncrawl.org", "/x", Klass.PACED, pipeline, 0.0, 503, note=note
    )


def capture(fmt: logging.Formatter) -> tuple[AccessLog, list[str], list[float]]:
    out: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            out.append(fmt.format(record))

    logger = logging.getLogger(f"politeproxy.access.test{id(out)}")
    logger.handlers[:] = [Capture()]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    now = [0.0]
    return AccessLog(logger, clock=lambda: now[0], wall=lambda: 1_800_000_000.0 + now[0]), out, now


def test_refusals_of_one_cause_are_summed_per_interval() -> None:
    log, out, now = capture(logging.Formatter(PLAIN_FORMAT))
    for i in range(600):  # 60 s of a tight loop, ten a second
        now[0] = i * 0.1
        log.access(refused())
    assert len(out) == 2, out
    assert " repeated=" not in out[0]
    assert out[1].endswith("repeated=299 first=2027-01-15T08:00:00Z last=2027-01-15T08:00:29Z"), out[1]
    log.access(refused("queue_full"))  # another cause, another pipeline: a line of its own
    log.access(refused(pipeline="other"))
    ok = Exchange("10.0.0.1", "GET", "data.commoncrawl.org", "/x", Klass.PACED, "etl", 0.0, 200)
    for _ in range(3):
        log.access(ok)  # answers are never summed
    assert len(out) == 7


def test_the_sum_is_in_the_json_line_too() -> None:
    log, out, now = capture(JsonFormatter())
    for i in range(40):
        now[0] = float(i)
        log.access(refused())
    doc = json.loads(out[-1])
    assert doc["note"] == "max_wait" and doc["repeated"] == 29 and doc["first"].endswith("Z")
