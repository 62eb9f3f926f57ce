"""bench/syscalls.py reads strace -c's summary (the table below is strace 6.1's, from a run of Squid)."""

from __future__ import annotations

from bench.syscalls import parse

SUMMARY = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 31.22    0.412337          17     23880           epoll_ctl
 24.10    0.318251          15     21000      2987 read
 20.05    0.264787          18     14010           write
  3.40    0.044901          11      3930           fcntl
  0.02    0.000231         231         1         1 restart_syscall
------ ----------- ----------- --------- --------- ----------------
100.00    1.320634          20     62821      2988 total
"""


def test_every_call_counted_errors_included_total_left_out() -> None:
    got = parse(SUMMARY)
    assert got == {"epoll_ctl": 23880, "read": 21000, "write": 14010, "fcntl": 3930, "restart_syscall": 1}
    assert sum(got.values()) == 62821


def test_what_is_not_a_row_is_no_call() -> None:
    assert parse("") == {}
    assert parse("strace: Process 1 attached\nstrace: Process 1 detached\n<detached ...>\n") == {}
    assert parse("100.00    1.3   20   abc   total\n") == {}
