"""Opening the data dir's records safely: never through a symlink, never readable by other users.

Every record under the data dir (``ratelimit.lock``, ``fair``, ``hosts/``, ``windows/``, ``holds/``,
``proxies/``) is opened with ``O_NOFOLLOW`` relative to a folder opened with ``O_DIRECTORY | O_NOFOLLOW``
(a checked folder): a symlink planted in place of a record or of a folder is refused, never written
through (issue 42 item 5). Records and folders are created 0600 and 0700: ``flock`` works on a read-only
descriptor, so a record other users can open is a lock other users can hold (issue 42 item 2). The data
dir itself is the operator's choice and may be a symlink.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from pathlib import Path

from politeproxy.stores.base import StoreError

log = logging.getLogger("politeproxy.store")

NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
RECORD_MODE = 0o600
DIR_MODE = 0o700


def refused(path: str | Path, e: OSError) -> StoreError:
    """The error for a record that cannot be opened; a symlink named as what it is."""
    if e.errno in (errno.ELOOP, errno.EMLINK):
        return StoreError(f"{path} is a symlink: refused (records are never written through one)")
    return StoreError(f"cannot open {path}: {e}")


def folder(parent: Path, name: str) -> int:
    """A descriptor of ``parent/name``, made (0700) when missing; a symlink or a file there is refused."""
    path = parent / name
    try:
        os.makedirs(parent, DIR_MODE, exist_ok=True)  # the data dir itself: the operator's choice
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        pass
    except OSError as e:
        raise StoreError(f"cannot make {path}: {e}") from e
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | NOFOLLOW)
    except NotADirectoryError:
        msg = f"{path} is a file, not a directory: move it away (the store keeps records in it)"
        if path.is_symlink():
            msg = f"{path} is a symlink: refused (records are never written through one)"
        raise StoreError(msg) from None
    except OSError as e:
        raise refused(path, e) from None


def record(dir_fd: int | None, name: str | Path, create: bool = True, shown: Path | None = None) -> int:
    """A record opened read-write without following a symlink (relative to ``dir_fd``; created 0600 when
    ``create``). FileNotFoundError passes through (a record not made yet); other faults are StoreErrors."""
    flags = os.O_RDWR | NOFOLLOW | (os.O_CREAT if create else 0)
    try:
        return os.open(name, flags, RECORD_MODE, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise refused(shown or name, e) from None


def own_only(fd: int, path: Path) -> None:
    """Make a lock file others could open 0600 (one made by an earlier version, 0644): whoever can open
    it can hold its flock, and so the whole data dir's schedule. Logged; left as it is when it cannot be
    changed (another user's file: the operator's to fix)."""
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o077 and st.st_uid == os.getuid():
            os.fchmod(fd, RECORD_MODE)
            log.warning("%s was readable by others (flock works on a read-only descriptor): made 0600", path)
    except OSError as e:
        log.warning("%s is readable by others and cannot be made 0600: %s", path, e)


def read_small(dir_fd: int | None, name: str | Path, most: int) -> bytes | None:
    """Up to ``most`` bytes of a record, None when it is missing, a symlink or unreadable."""
    try:
        fd = os.open(name, os.O_RDONLY | NOFOLLOW, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return os.read(fd, most)
    except OSError:
        return None
    finally:
        os.close(fd)


def replace_whole(dir_fd: int, name: str, data: bytes) -> None:
    """Write a record whole through a temporary file and a rename (a reader sees the old one or the new
    one, never half); the temporary is created exclusively, so a planted symlink is never followed, and the
    rename replaces a symlink at ``name`` itself, never its target."""
    tmp = f".{name}.{os.getpid()}.tmp"
    try:
        os.unlink(tmp, dir_fd=dir_fd)  # a left-over of a crash of a process with this pid
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, RECORD_MODE, dir_fd=dir_fd)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def bounded(dir_fd: int, most: int, keep: Callable[[str], bool] = lambda n: False) -> int:
    """Make room for one more record in a folder holding at most ``most``: the oldest (by change time)
    that ``keep`` does not protect are removed. Returns how many were removed."""
    entries: list[tuple[float, str]] = []
    with os.scandir(dir_fd) as it:
        for e in it:
            if e.name.startswith(".") or keep(e.name):
                continue
            try:
                entries.append((e.stat(follow_symlinks=False).st_mtime, e.name))
            except OSError:
                continue
    if len(entries) < most:
        return 0
    entries.sort()
    gone = 0
    for _, name in entries[: len(entries) - most + 1]:
        try:
            os.unlink(name, dir_fd=dir_fd)
            gone += 1
        except OSError:
            pass
    return gone


def count(dir_fd: int) -> int:
    with os.scandir(dir_fd) as it:
        return sum(1 for e in it if not e.name.startswith("."))
