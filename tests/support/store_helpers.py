"""What the store test modules share (tests/unit/stores/: test_contract.py, test_file.py,
test_failover.py): a settable wall clock, its start time, a backoff without jitter, a host name."""

from __future__ import annotations

from politeproxy.policy.backoff import BackoffPolicy

T0 = 1_700_000_000.0
NOJITTER = BackoffPolicy(base=1.0, cap=300.0, jitter=0.0)
H = "data.commoncrawl.org"


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t
