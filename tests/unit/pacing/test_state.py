"""The pacer's pure queue state with a fake clock: no loop, no sleeps, every time passed in."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from politeproxy.pacing.state import HINT_CAP, HINT_GRACE, QueueState, Waiter

A, B, C = "a.commoncrawl.org", "b.commoncrawl.org", "c.commoncrawl.org"


@dataclass(eq=False)
class Ticket:
    gone: bool = False

    def done(self) -> bool:
        return self.gone


def waiter(host: str, arrived: float, deadline: float = 100.0) -> Waiter[Ticket]:
    return Waiter(host, arrived, deadline, Ticket())


def test_the_longest_waiting_head_of_a_ready_host_goes_next() -> None:
    s: QueueState[Ticket] = QueueState()
    for host, t in [(A, 1.0), (B, 0.5), (A, 0.2), (C, 2.0)]:
        s.add(waiter(host, t))
    assert s.next_ready(10.0) == (B, None)  # A's head arrived at 1.0 (FIFO per line), B's at 0.5
    assert s.pop_live(B) is not None
    assert s.next_ready(10.0) == (A, None)
    assert s.depth() == 3 and s.depth(A) == 2


def test_a_host_in_backoff_is_skipped_and_says_when_it_is_ready() -> None:
    s: QueueState[Ticket] = QueueState()
    s.add(waiter(A, 0.0))
    s.add(waiter(B, 1.0))
    s.hold(A, 20.0, now=10.0)
    assert s.next_ready(10.0) == (B, 20.0)
    s.pop_live(B)
    assert s.next_ready(10.0) == (None, 20.0)
    assert s.next_ready(20.0) == (A, None)
    s.hold(A, 15.0, now=10.0)  # hold never pulls a hint in
    assert s.ready_at(A) == 20.0


def test_waiters_that_left_are_dropped_and_empty_lines_vanish() -> None:
    depths: list[tuple[str, int]] = []
    s: QueueState[Ticket] = QueueState(lambda h, _p, d: depths.append((h, d)))  # one line: its depth
    w1, w2 = waiter(A, 0.0), waiter(A, 1.0)
    s.add(w1)
    s.add(w2)
    w1.ticket.gone = True
    w2.ticket.gone = True
    assert s.next_ready(5.0) == (None, None)
    assert s.queues == {} and s.total == 0
    assert depths[-1] == (A, 0)
    assert not s.remove(w1)  # already gone: no double count
    assert s.total == 0


def test_the_estimate_counts_only_what_could_go_now() -> None:
    s: QueueState[Ticket] = QueueState()
    for i in range(10):
        s.add(waiter(A, float(i)))
    s.hold(A, 30.0, now=0.0)  # A's line waits behind a backoff
    # B is ready and nothing ready is ahead of it: its wait is no longer than its own line.
    assert s.estimate(B, 0.0, gap=0.2, interval=0.0) == 0.0
    # A itself: its backoff plus its line at the host's pace.
    assert s.estimate(A, 0.0, gap=0.2, interval=1.0) == 30.0 + 10 * 1.0
    # Once A is ready, its line is ahead of B on the global schedule.
    assert s.estimate(B, 31.0, gap=0.2, interval=0.0) == 10 * 0.2


def test_hints_pass_after_a_grace_and_are_capped() -> None:
    s: QueueState[Ticket] = QueueState()
    for i in range(HINT_CAP + 100):
        s.set_ready(f"n{i}.commoncrawl.org", 1000.0 + i, now=0.0)
    assert len(s.ready) == HINT_CAP  # the soonest ones went first
    assert "n0.commoncrawl.org" not in s.ready and f"n{HINT_CAP + 99}.commoncrawl.org" in s.ready
    s.prune(now=2000.0)
    assert s.ready == {}
    s.set_ready(A, 10.0, now=0.0)
    s.prune(now=10.0 + HINT_GRACE / 2)
    assert A in s.hosts()  # kept a little after it passed, for the backoff gauge's last refresh
    s.prune(now=10.0 + HINT_GRACE)
    assert A not in s.hosts()


ops = st.lists(
    st.tuples(st.sampled_from(["add", "leave", "pop", "hold", "next", "prune"]), st.sampled_from([A, B, C])),
    max_size=80,
)


@settings(max_examples=200, deadline=None)
@given(ops=ops)
def test_counts_and_tables_stay_consistent(ops: list[tuple[str, str]]) -> None:
    """Whatever order waiters come, leave, get popped and hosts back off in, ``total`` equals the waiters
    in the lines, no empty line is kept, and every estimate is finite and non-negative."""
    s: QueueState[Ticket] = QueueState()
    now = 0.0
    live: list[Waiter[Ticket]] = []
    for op, host in ops:
        now += 0.5
        if op == "add":
            w = waiter(host, now)
            s.add(w)
            live.append(w)
        elif op == "leave" and live:
            w = live.pop(0)
            w.ticket.gone = True
            s.remove(w)
        elif op == "pop":
            s.pop_live(host)
        elif op == "hold":
            s.hold(host, now + 3.0, now)
        elif op == "next":
            s.next_ready(now)
        else:
            s.prune(now)
        assert s.total == sum(len(q) for q in s.queues.values())
        assert all(s.queues.values())
        est = s.estimate(host, now, 0.2, 1.0)
        assert est >= 0.0 and est == est and est != float("inf")
