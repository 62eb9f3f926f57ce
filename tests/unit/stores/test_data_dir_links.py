"""Issue 42 item 5: symlinks in the data dir are never written through, and holds/ and windows/ are
bounded like hosts/. The finding: ``ratelimit.lock``, ``hosts/<host>``, ``windows/<service>`` and ``fair``
planted as symlinks made the proxy overwrite (and truncate) 4 of 4 files outside the data dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from politeproxy.policy.fairclaim import FairAsk
from politeproxy.policy.heartbeat import make_beat
from politeproxy.policy.holds import HoldNote
from politeproxy.policy.services import service_key
from politeproxy.policy.window import WindowRule
from politeproxy.stores import holdnotes
from politeproxy.stores.base import StoreError
from politeproxy.stores.file import FileStore
from politeproxy.stores.heartbeats import FileBeats
from politeproxy.stores.holdnotes import FileNotes
from tests.support.store_helpers import T0, Clock

H = "data.commoncrawl.org"
RULE = WindowRule(service_key(H), "nat-a", 20.0, 100)
PRECIOUS = b"a file outside the data dir\n"


async def use_the_store(data: Path) -> None:
    """What a proxy does with the data dir: a paced claim counted in the window with a fair turn, a
    backoff, a hold note and a heartbeat. Any of them may be refused (StoreError); none may write through."""
    store = FileStore(data)
    try:
        for call in (
            lambda: store.claim(H, 0.01, 0.0, 5.0, window=RULE, fair=FairAsk("p", 1.0, "a", ("p",))),
            lambda: store.mirror_backoff(H, 5.0),
        ):
            try:
                await call()
            except StoreError:
                pass
    finally:
        await store.close()
    await FileNotes(data).put_quietly(HoldNote(H, "block", "403 from CloudFront", 403, T0, T0 + 60.0))
    try:
        await FileBeats(data).put(make_beat("a:1:1", "127.0.0.1:1", "v", T0, T0, {}))
    except StoreError:
        pass


@pytest.mark.parametrize(
    "planted", ["ratelimit.lock", "fair", f"hosts/{H}", f"windows/{RULE.service}", f"holds/{H}.json"]
)
async def test_symlinks_in_the_data_dir_are_not_written_through(tmp_path: Path, planted: str) -> None:
    data, outside = tmp_path / "data", tmp_path / "outside"
    outside.write_bytes(PRECIOUS)
    link = data / planted
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    try:
        await use_the_store(data)
    except StoreError as e:  # refused at start: the message names the symlink
        assert planted in str(e) and "symlink" in str(e), e
    assert outside.read_bytes() == PRECIOUS


@pytest.mark.parametrize("folder", ["hosts", "windows", "holds", "proxies"])
async def test_a_symlinked_folder_in_the_data_dir_is_not_written_through(tmp_path: Path, folder: str) -> None:
    data, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    data.mkdir()
    (data / folder).symlink_to(outside, target_is_directory=True)
    try:
        await use_the_store(data)
    except StoreError as e:
        assert folder in str(e) and "symlink" in str(e), e
    assert os.listdir(outside) == []


async def test_holds_and_windows_are_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The finding: 2,000 releases of made-up names left 2,001 files in holds/; windows/ had no bound."""
    monkeypatch.setattr(holdnotes, "MAX_NOTES", 10)
    monkeypatch.setattr("politeproxy.stores.file_windows.MAX_WINDOW_FILES", 5)
    notes = FileNotes(tmp_path)
    for k in range(30):
        await notes.put(HoldNote(f"h{k}.commoncrawl.org", "released", "", 0, T0 + k, T0 + k))
    assert len(os.listdir(tmp_path / "holds")) <= 10
    assert await notes.get(["h29.commoncrawl.org"])  # the newest is kept
    clock = Clock()
    store = FileStore(tmp_path, clock=clock)
    try:
        for k in range(20):
            rule = WindowRule(f"s{k}.commoncrawl.org", "nat-a", 20.0, 100)
            assert (await store.claim(f"s{k}.commoncrawl.org", 0.0, 0.0, 5.0, window=rule)).granted
        assert len(os.listdir(tmp_path / "windows")) <= 5 + 1  # the services beyond share "_overflow"
    finally:
        await store.close()
