"""Pipeline names expire (issue 27 item 3): a name unused for NAME_IDLE gives its place up to the next
new one, instead of holding it for the life of the process; a name in use keeps it. The pacer's fair
shares keep FAIR_NAMES places, far more than the metrics' labels."""

from __future__ import annotations

from politeproxy.pacing.pacer import Pacer, PacingSettings
from politeproxy.policy.fairness import FAIR_NAMES, FREE_PIPELINES, NAME_IDLE, OTHER_PIPELINE, PipelineNames
from politeproxy.stores.memory import MemoryStore


def test_idle_names_give_their_place_to_a_new_one() -> None:
    names = PipelineNames(free=3, idle=600.0)
    for i in range(3):
        assert names.counted_as(f"throwaway-{i}", now=0.0) == f"throwaway-{i}"
    assert names.counted_as("late", now=599.0) == OTHER_PIPELINE  # every place still held
    assert names.counted_as("late", now=600.0) == "late"  # the throw-away names went idle: one expired
    assert names.expired >= 1


def test_a_name_in_use_keeps_its_place() -> None:
    names = PipelineNames(free=2, idle=600.0)
    names.counted_as("busy", now=0.0)
    names.counted_as("once", now=0.0)
    names.touch("busy", 500.0)
    assert names.counted_as("new", now=700.0) == "new"  # "once" was idle 700 s: its place went
    assert names.counted_as("busy", now=700.0) == "busy"
    assert set(names.seen) == {"busy", "new"}


def test_without_a_clock_places_are_first_come() -> None:
    names = PipelineNames(free=2)
    assert [names.counted_as(n) for n in ("a", "b", "c")] == ["a", "b", OTHER_PIPELINE]


def test_the_pacer_counts_fifty_throwaway_names_then_a_new_pipeline_after_they_expire() -> None:
    t = [0.0]
    pacer = Pacer(MemoryStore(), PacingSettings(), monotonic=lambda: t[0])
    assert FAIR_NAMES > FREE_PIPELINES  # fair shares are not bounded by the label cap
    pacer._pipelines.free = 50  # the old bound: 50 names, then everyone was "other" for good
    for i in range(50):
        assert pacer.pipeline_of(f"x{i}") == f"x{i}"
    assert pacer.pipeline_of("newcomer") == OTHER_PIPELINE
    t[0] = NAME_IDLE + 1.0
    assert pacer.pipeline_of("newcomer2") == "newcomer2"  # its own share once the others went idle
    assert pacer.pipeline_of("newcomer") == "newcomer"  # a cached "other" is counted afresh too
