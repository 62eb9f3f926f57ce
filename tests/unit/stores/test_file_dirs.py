"""The file store's refusals name what is wrong (issue 25 item 11): a ``hosts`` (or ``windows``) that is a
file is named as such, not as a lock that cannot be opened."""

from __future__ import annotations

from pathlib import Path

import pytest

from politeproxy.stores.base import StoreError
from politeproxy.stores.file import FileStore


@pytest.mark.parametrize("name", ["hosts", "windows"])
def test_a_record_dir_that_is_a_file_is_named(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text("not a directory")
    with pytest.raises(StoreError) as e:
        FileStore(tmp_path)
    assert f"{tmp_path / name} is a file, not a directory" in str(e.value)
    assert "ratelimit.lock" not in str(e.value)
