"""``politeproxy simulate --job`` (issue 45 item 5): a job's counts read defensively; the job simulation
against the proxy's own pacer on a virtual clock (each part keeping its requests at the pacer, the next one
asked when one goes), so a mixed pipeline's index share is the proxy's; and the 3,600-request case."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from politeproxy.commands import simjob
from politeproxy.pacing.base import PacingSettings
from politeproxy.pacing.pacer import Pacer
from politeproxy.policy.classify import Klass
from politeproxy.policy.jobs import JobPart, parse_job
from politeproxy.policy.simulation import EXEMPT, WorkloadError
from politeproxy.stores.memory import MemoryStore
from tests.support.virtual_clock import T0, VirtualClock, vclock_fixture  # noqa: F401 - the vclock fixture

INDEX = "index.commoncrawl.org"
DATA = "data.commoncrawl.org"


def test_a_job_is_counts_per_kind() -> None:
    assert parse_job("index=20000, warc=1000000") == (
        JobPart("default", "index", "paced", INDEX, 20000),
        JobPart("default", "warc", "paced", DATA, 1000000),
    )
    assert parse_job("a:exempt=5,a:exempt=6,b:paced@commoncrawl.s3.amazonaws.com=1") == (
        JobPart("a", "exempt", EXEMPT, DATA, 11),
        JobPart("b", "paced", "paced", "commoncrawl.s3.amazonaws.com", 1),
    )
    assert parse_job("warc=3,paced=4") == (JobPart("default", "warc", "paced", DATA, 7),)  # one part


@pytest.mark.parametrize(
    "text, why",
    [
        ("", "empty"),
        ("index=5/s", "KIND"),
        ("pages=10", "the kind is"),
        ("index=0", "no requests"),
        ("index=1500000,warc=1500000", "at most"),
        ("a b:index=3", "pipeline"),
        ("index@not a host=3", "not a host"),
    ],
)
def test_a_job_it_cannot_use_is_one_line(text: str, why: str) -> None:
    with pytest.raises(WorkloadError, match=why):
        parse_job(text)


@given(st.text(max_size=80))
def test_parse_job_never_raises_anything_else(text: str) -> None:
    try:
        parts = parse_job(text)
    except WorkloadError as e:
        assert "\n" not in str(e)
        return
    assert parts and all(p.count > 0 for p in parts)


# Binary fractions (tests/support/virtual_clock.py): every slot is exact on both clocks.
SETTINGS = PacingSettings(gap=0.25, max_wait=8.0, host_intervals=((INDEX, 1.0),))


async def through_pacer(parts: tuple[JobPart, ...], vclock: VirtualClock) -> dict[str, float]:
    """Each part as IN_FLIGHT tasks at the proxy's own pacer, each asking for the next request as soon as
    its last one went: the last send time of each part, from the start."""
    pacer = Pacer(MemoryStore(clock=vclock, rand=lambda: 0.5), SETTINGS, monotonic=vclock)
    left = {p.kind: p.count for p in parts}
    last: dict[str, float] = {}

    async def worker(p: JobPart) -> None:
        while left[p.kind] > 0:
            left[p.kind] -= 1
            async with pacer.permit(p.host, Klass.PACED, None, p.pipeline):
                last[p.kind] = vclock() - T0

    await asyncio.gather(*(worker(p) for p in parts for _ in range(simjob.IN_FLIGHT)))
    await pacer.close()
    return last


@pytest.mark.parametrize("job", ["index=120,warc=600", "index=40,warc=100", "a:index=60,b:warc=300"])
async def test_a_mixed_job_finishes_when_the_pacer_says(job: str, vclock: VirtualClock) -> None:
    parts = parse_job(job)
    real = await through_pacer(parts, vclock)
    simulated = {p["kind"]: p["last_s"] for p in simjob.simulate_job(SETTINGS, parts)["parts"]}
    assert simulated.keys() == real.keys()
    for kind, t in real.items():
        # Several requests of a part ask at one instant: asyncio and the simulation may take them in
        # another order, which moves a finish by a slot at most.
        assert abs(simulated[kind] - t) <= SETTINGS.gap, (kind, simulated, real)


def test_the_index_share_of_a_mixed_pipeline_is_the_proxys() -> None:
    """The case of the issue: 3,600 index lookups in one pipeline with WARC reads, at the defaults (one grant
    per 200 ms, the index host at most once a second). Every lookup goes, none refused; the index part gets
    about three grants in four of the ones it may take (its 1 s interval and the pipeline's one fair line
    between the two hosts), so its last lookup goes after about 4,900 s, not 3,600 and not days."""
    r = simjob.simulate_job(PacingSettings(), parse_job("index=3600,warc=20000"))
    index, warc = r["parts"]
    assert index["kind"] == "index" and index["sent"] == 3600 and index["retried"] == 0
    assert warc["sent"] == 20000
    assert 3600 <= index["last_s"] <= 5400, index
    # Over the job, the two together keep the global schedule: 23,600 grants at 5/s, one after the other.
    assert r["duration_s"] == pytest.approx(23600 * 0.2, rel=0.05)
