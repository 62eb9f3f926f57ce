"""logs.LoopBatchedHandler (one write per loop pass for lines logged on the loop) and PlainFormatter
(the date text made once per second), against the stdlib's own output."""

from __future__ import annotations

import asyncio
import io
import logging
import threading

from hypothesis import given
from hypothesis import strategies as st

from politeproxy.logs import PLAIN_FORMAT, LoopBatchedHandler, PlainFormatter


class CountingStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


def _logger(handler: logging.Handler, name: str) -> logging.Logger:
    logger = logging.getLogger(f"politeproxy.test.batching.{name}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger


def _handler() -> tuple[LoopBatchedHandler, CountingStream]:
    out = CountingStream()
    h = LoopBatchedHandler(out)  # type: ignore[arg-type]
    h.setFormatter(logging.Formatter("%(message)s"))
    return h, out


def test_lines_of_one_loop_pass_go_out_in_one_write_and_in_order() -> None:
    h, out = _handler()
    log = _logger(h, "pass")

    async def main() -> tuple[str, int]:
        for i in range(5):
            log.info("line %d", i)
        kept = out.getvalue()  # nothing written yet: the pass has not ended
        await asyncio.sleep(0)  # one pass: the drain runs
        await asyncio.sleep(0)
        return kept, out.writes

    kept, writes = asyncio.run(main())
    assert kept == ""
    assert writes == 1
    assert out.getvalue() == "".join(f"line {i}\n" for i in range(5))


def test_without_a_loop_each_line_is_written_at_once() -> None:
    h, out = _handler()
    log = _logger(h, "noloop")
    log.info("one")
    assert out.getvalue() == "one\n"
    log.info("two")
    assert out.getvalue() == "one\ntwo\n" and out.writes == 2


def test_a_line_from_another_thread_follows_the_lines_kept_before_it() -> None:
    h, out = _handler()
    log = _logger(h, "thread")

    async def main() -> None:
        log.info("first, on the loop")
        t = threading.Thread(target=log.info, args=("second, from a thread",))
        t.start()
        t.join()
        log.info("third, on the loop")
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert out.getvalue() == "first, on the loop\nsecond, from a thread\nthird, on the loop\n"


def test_flush_writes_what_is_kept_as_logging_shutdown_does() -> None:
    h, out = _handler()
    log = _logger(h, "flush")

    async def main() -> None:
        log.info("kept")
        h.flush()  # logging.shutdown() at exit: before the loop's next pass
        assert out.getvalue() == "kept\n"

    asyncio.run(main())
    assert out.writes == 1  # the drain afterwards found nothing left


def test_a_closed_stream_never_raises_into_the_loop() -> None:
    h, out = _handler()
    log = _logger(h, "closed")
    errors: list[object] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _loop, ctx: errors.append(ctx))
        log.info("to nowhere")
        out.close()
        await asyncio.sleep(0)
        await asyncio.sleep(0)

    asyncio.run(main())
    assert errors == []


@given(created=st.floats(min_value=0, max_value=4e9, allow_nan=False), msg=st.text(max_size=20))
def test_plain_formatter_matches_the_stdlib_formatter(created: float, msg: str) -> None:
    record = logging.LogRecord("politeproxy.access", logging.INFO, __file__, 1, msg, None, None)
    record.created, record.msecs = created, (created - int(created)) * 1000
    ours, stdlib = PlainFormatter(), logging.Formatter(PLAIN_FORMAT)
    assert ours.format(record) == stdlib.format(record)
    record.created += 0.001  # the same second again: the cached text
    record.msecs = (record.created - int(record.created)) * 1000
    assert ours.format(record) == stdlib.format(record)


def test_lines_after_the_loop_ended_come_after_the_loops_lines() -> None:
    h, out = _handler()
    log = _logger(h, "ended")

    async def main() -> None:
        log.info("in the loop")

    asyncio.run(main())
    log.info("after it")
    assert out.getvalue() == "in the loop\nafter it\n"
    asyncio.run(main())  # a new loop on the same thread is found again
    log.info("after the second")
    assert out.getvalue() == "in the loop\nafter it\nin the loop\nafter the second\n"
