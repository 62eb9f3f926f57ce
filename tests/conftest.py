"""Shared fixtures and hooks: a local TLS upstream impersonating Common Crawl's hosts, and proxy processes.

This module holds only fixtures and hooks. The helpers behind them live in tests/support/: ``processes``
(paths, tools, ports, waiting), ``upstream_proc`` (the fake upstream and its certificates) and
``proxy_proc`` (proxy processes and their configs); test files and bench/ import them from there, never
from this module or from another test module (tests/test_layout_rules.py checks it).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

# The helpers' asserts get pytest's rewritten messages, as they did when they lived in this module or in a
# test module; registered before any import of them (outside pytest, e.g. under bench/, a no-op).
pytest.register_assert_rewrite(
    "tests.support.proxy_proc",
    "tests.support.clients",
    "tests.support.live_status",
    "tests.support.pacing_clients",
    "tests.support.proxyio",
    "tests.support.quiet_proxy",
)

from tests.support.proxy_proc import (  # noqa: E402
    FAST,
    NO_ROBOTS,
    STARTED,
    ProxyProc,
    for_this_test,
    leftover_proxies,
    start_proxy,
)
from tests.support.suite_order import by_cost  # noqa: E402
from tests.support.upstream_proc import (  # noqa: E402
    Certs,
    Upstream,
    make_certs,
    start_upstream,
)

# A failure pytest cannot format is still reported as a failure (see the module).
pytest_plugins = ["tests.support.reportguard"]


def pytest_configure(config: pytest.Config) -> None:
    """The test session's environment, inherited by every process a test starts. Set here, not at import:
    bench/ imports the helpers in tests/support/ and must run politeproxy as a user's install does."""
    # Every proxy a test starts runs the default transports, what a plain install gets; the optional [fast]
    # extra (aiofastnet) is installed for the tests and exercised by tests/e2e/test_fastnet_e2e.py. Under a
    # loaded two-worker run, a proxy on aiofastnet once held a freed connection place past a 10 s read
    # (test_max_connections_counts_clients_and_tunnels): not reproduced alone; docs/performance.md has it.
    os.environ.setdefault("POLITEPROXY_FASTNET", "0")
    # Tests start Python again and again (proxies, the CLI, load clients). Where PYTHONDONTWRITEBYTECODE is
    # set (some images and shells set it), each start compiled politeproxy from source (~0.1 s of CPU a start,
    # a tenth of the quick suite). Bytecode goes to a cache outside the checkout instead, which stays clean.
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        pycache = Path(tempfile.gettempdir()) / f"politeproxy-tests-pycache-{os.getuid()}"
        os.environ.setdefault("PYTHONPYCACHEPREFIX", str(pycache))
        sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]
        sys.dont_write_bytecode = False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The costliest files first (tests/support/suite_order.py): under ``--dist loadfile`` each worker takes
    the next file as it finishes one, so the long ones start at once and the run ends on short ones."""
    items[:] = by_cost(items)


@pytest.fixture(scope="module", autouse=True)
def no_proxy_left_running() -> Iterator[None]:
    """Every proxy a module's tests and fixtures start is stopped by the module's end: one left running
    eats the CPU later tests' timings need (the fair-turn tests once left twelve)."""
    since = len(STARTED)
    yield
    left = leftover_proxies(since)
    assert not left, f"proxies left running (stopped now), started by: {left}"


@pytest.fixture(scope="session")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("upstream-certs"))


@pytest.fixture
def upstream(module_upstream: Upstream) -> Upstream:
    """A fake upstream in a fresh state: the module's one server (started once per module, about 0.5 s),
    reset before each test (arrival log, throttles, robots, capacity and table delay). A test that stops
    or breaks its upstream starts its own with ``start_upstream``."""
    module_upstream.reset()
    return module_upstream


@pytest.fixture
def files_dir(tmp_path: Path) -> Path:
    """A directory the ``files_upstream`` serves (under /files/ and /cc-index/table/)."""
    d = tmp_path / "files"
    d.mkdir()
    return d


@pytest.fixture
def files_upstream(certs: Certs, tmp_path: Path, files_dir: Path) -> Iterator[Upstream]:
    """A fake upstream of its own that serves the files written into ``files_dir``."""
    up = start_upstream(certs, tmp_path, files_dir=files_dir)
    yield up
    up.stop()


@pytest.fixture
def proxy_factory(tmp_path: Path, certs: Certs) -> Iterator[Callable[..., ProxyProc]]:
    started: list[ProxyProc] = []

    def make(up: Upstream | None, extra_toml: str = "", **kw: Any) -> ProxyProc:
        p = start_proxy(tmp_path, up, certs, extra_toml, **kw)
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop()


@pytest.fixture
def proxy(proxy_factory: Callable[..., ProxyProc], upstream: Upstream) -> ProxyProc:
    """One proxy in front of the fake upstream, robots off so arrival logs hold only the test's requests."""
    return proxy_factory(upstream, NO_ROBOTS)


# -- once per module (see /work/notes/T-fixtures.md) ---------------------------------------------------
# Starting a proxy costs about a second; a module whose cases only send requests shares one. A test that
# changes config, sends SIGHUP, kills or restarts a process keeps its own (proxy_factory).


@pytest.fixture(scope="module")
def module_tmp(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory that lives as long as the module (configs, data dirs and logs of module proxies)."""
    return tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])


@pytest.fixture(scope="module")
def module_upstream(certs: Certs, module_tmp: Path) -> Iterator[Upstream]:
    """One fake upstream for the whole module. Tests take ``shared_upstream`` (reset first) instead."""
    up = start_upstream(certs, module_tmp)
    yield up
    up.stop()


@pytest.fixture(scope="module")
def module_files_dir(module_tmp: Path) -> Path:
    """``files_dir`` once per module (tests write files of distinct names into it)."""
    d = module_tmp / "files"
    d.mkdir()
    return d


@pytest.fixture(scope="module")
def module_files_upstream(certs: Certs, module_tmp: Path, module_files_dir: Path) -> Iterator[Upstream]:
    """``files_upstream`` once per module, serving ``module_files_dir``. Call ``reset()`` in each test."""
    up = start_upstream(certs, module_tmp, files_dir=module_files_dir)
    yield up
    up.stop()


@pytest.fixture
def shared_upstream(module_upstream: Upstream) -> Upstream:
    """The module's upstream with an empty arrival log and no throttle, robots or capacity rule."""
    module_upstream.reset()
    return module_upstream


@pytest.fixture(scope="module")
def module_proxy_factory(module_tmp: Path, certs: Certs) -> Iterator[Callable[..., ProxyProc]]:
    """``proxy_factory``'s call, but each proxy it starts lives until the module ends."""
    started: list[ProxyProc] = []

    def make(up: Upstream | None, extra_toml: str = "", **kw: Any) -> ProxyProc:
        p = start_proxy(module_tmp, up, certs, extra_toml, **kw)
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop()


@pytest.fixture(scope="module")
def module_proxy(module_proxy_factory: Callable[..., ProxyProc], module_upstream: Upstream) -> ProxyProc:
    """``proxy`` once per module: robots off, in front of ``module_upstream``. Use with shared_upstream."""
    return module_proxy_factory(module_upstream, NO_ROBOTS)


@pytest.fixture(scope="module")
def module_fast_proxy(module_proxy_factory: Callable[..., ProxyProc], module_upstream: Upstream) -> ProxyProc:
    """A FAST proxy (memory store, no global gap, robots off) in front of ``module_upstream``, per module."""
    return module_proxy_factory(module_upstream, FAST)


@pytest.fixture
def shared_fast_proxy(module_fast_proxy: ProxyProc) -> ProxyProc:
    """``module_fast_proxy`` for one test (checked alive, log marked)."""
    return for_this_test(module_fast_proxy)


@pytest.fixture
def shared_proxy(module_proxy: ProxyProc) -> ProxyProc:
    """``module_proxy``, checked alive, its log marked so ``log_since()`` shows only this test's lines."""
    return for_this_test(module_proxy)
