"""The small-GET hot path (issue 10: no slowdown against the old tree): the shortcuts taken for speed give the
same answers as the general code, and a routine success costs no task. Answers and counts, never speed."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from politeproxy.pacing.pacer import Pacer, PacingSettings
from politeproxy.policy.fairness import MAX_NAME, clean_name
from politeproxy.policy.hosts import DEFAULT_PACED_HOSTS, HostSet, host_matches
from politeproxy.policy.routing import _IP_CHARS, Target, parse_host
from politeproxy.stores.file import FileStore
from politeproxy.stores.memory import MemoryStore

H = "data.commoncrawl.org"


def slow_clean_name(raw: str) -> str:
    """The per-character definition clean_name's fast path must agree with."""
    return "".join(c if 33 <= ord(c) < 127 and c not in "\"'\\" else "_" for c in raw[:MAX_NAME])


@given(
    st.one_of(st.text(max_size=80), st.text(st.characters(min_codepoint=30, max_codepoint=130), max_size=70))
)
def test_clean_name_fast_path_gives_the_per_character_answer(raw: str) -> None:
    """Any text (client-chosen pipeline names): the same name as the per-character rule, never raising."""
    assert clean_name(raw) == slow_clean_name(raw)


def test_clean_name_keeps_a_clean_name_and_cuts_a_long_one() -> None:
    assert clean_name("127.0.0.1") == "127.0.0.1"
    assert clean_name("a" * (MAX_NAME + 1)) == "a" * MAX_NAME
    assert clean_name("a b'c\\d\"") == "a_b_c_d_"


PATTERNS = [*DEFAULT_PACED_HOSTS, "Example.COM.", "*.a.b", "x.*.y.z"]
HOSTS = st.one_of(
    st.text(max_size=40),
    st.text(st.sampled_from("ac.*-[]: \tCOMmon.crawlorgs3useast1amazonaws"), max_size=45),
    st.sampled_from(["Data.CommonCrawl.org.", "[commoncrawl.org]", "commoncrawl.s3.us-east-1.amazonaws.com"]),
)


@given(HOSTS)
def test_host_set_matches_like_host_matches(host: str) -> None:
    """Any host text: HostSet.matches (patterns split once) answers as host_matches over each pattern."""
    hs = HostSet(PATTERNS)
    assert hs.matches(host) == any(host_matches(host, p) for p in hs.patterns)


def finishes_without_a_loop_turn(coro: Coroutine[Any, Any, Any]) -> bool:
    """Run a coroutine one step: True when it returned without suspending (no task, no shield)."""
    try:
        coro.send(None)
    except StopIteration:
        return True
    coro.close()
    return False


async def test_a_routine_success_is_recorded_without_a_task() -> None:
    pacer = Pacer(MemoryStore(rand=lambda: 0.0), PacingSettings(gap=0.0, host_intervals=()))
    try:
        assert await pacer._feedback(H, 200, None) is None  # the first success checks the store
        # within a second: nothing to write
        assert finishes_without_a_loop_turn(pacer._feedback(H, 200, None))
        assert not pacer._feedback_tasks
        # A throttle still goes through the shielded task, and the next success reaches the store again.
        delay = await pacer._feedback(H, 503, "2")
        assert delay is not None and delay.seconds >= 2
        assert not finishes_without_a_loop_turn(pacer._feedback(H, 200, None))
    finally:
        await pacer.close()


@pytest.mark.parametrize("held", [False, True])
async def test_file_store_claims_queue_behind_a_held_lock(tmp_path: Any, held: bool) -> None:
    """The in-process lock's fast path: a free lock is taken at once, a held one is waited for (bounded)."""
    store = FileStore(tmp_path)
    try:
        if held:
            async with store._held():
                waiter = asyncio.create_task(store.claim(H, 0.0, 0.0, 5.0))
                await asyncio.sleep(0.05)
                assert not waiter.done()  # queued behind the holder, not let through
            assert (await waiter).granted
        else:
            assert (await store.claim(H, 0.0, 0.0, 5.0)).granted
    finally:
        await store.close()


IP_TEXT = st.one_of(
    st.ip_addresses().map(str),
    st.ip_addresses(v=6).map(lambda a: str(a).upper()),
    st.ip_addresses(v=6).map(lambda a: a.exploded),
    st.text(st.sampled_from("0123456789abcdefABCDEFx.:%[] "), max_size=45),
    st.text(max_size=30),
)


@given(IP_TEXT)
def test_parse_host_skips_the_ip_parse_only_for_text_that_cannot_be_an_ip(host: str) -> None:
    """Any host text: whatever ipaddress reads as an address is spelt with [0-9a-fA-F.:] alone, so
    parse_host's shortcut never turns an IP literal into a name; and parse_host never raises."""
    try:
        ipaddress.ip_address(host)
        is_ip = "%" not in host
    except ValueError:
        is_ip = False
    if is_ip:
        assert _IP_CHARS.fullmatch(host)
    got = parse_host(host, 443, f"{host}:443")
    if is_ip and host.isascii():
        assert isinstance(got, Target) and got.ip == ipaddress.ip_address(host)
