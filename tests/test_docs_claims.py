"""What the docs name exists (issue 26: 9 of 15 spot-checked claims were stale, most of them names).

Every repository path, config key, metric, ``POLITEPROXY_*`` variable and ``politeproxy`` command named in
README.md, CONTRIBUTING.md and docs/*.md is looked up in the tree: a path on disk, a key in the settings
table (policy/table.py), a metric in observe/, a variable in the code, a command in the CLI's parser. And
the other way: every metric, command and variable of the code is in the manual. A rename or a removal
then fails here, with the page and the name, instead of leaving a page that points at nothing.
"""

from __future__ import annotations

import re
from pathlib import Path

from politeproxy.commands.cli import parser
from politeproxy.policy.table import SETTINGS
from tests.support.processes import ROOT

# Folders whose files the docs name by path.
TOP = ("politeproxy", "tests", "bench", "deploy", "grafana", "docs", ".ci")
SUBPACKAGES = ("policy", "stores", "cache", "pacing", "proxy", "config", "observe", "commands")
SECTIONS = (
    "auth",
    "client",
    "upstream",
    "schedule",
    "egress",
    "pacing",
    "robots",
    "exempt",
    "hosts",
    "pipelines",
    "cache",
)
# Variables of the test and bench tooling, documented with them, not read by the package.
TOOLING_VARS = {"POLITEPROXY_BENCH_SRC", "POLITEPROXY_DOCS_SCREENSHOT", "POLITEPROXY_JOBS_SCALE"}


def pages() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [p for p in found if p.exists()]


def code_spans(page: Path) -> list[str]:
    """Every inline code span and every line of a fenced block: where the docs name things."""
    text = page.read_text()
    fenced = re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S)
    inline = re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S))
    return inline + [line for block in fenced for line in block.splitlines()]


def named(pattern: str) -> dict[str, set[str]]:
    """{name: pages} for every match of ``pattern`` in the pages' code."""
    out: dict[str, set[str]] = {}
    for page in pages():
        for span in code_spans(page):
            for m in re.finditer(pattern, span):
                out.setdefault(m.group(1), set()).add(str(page.relative_to(ROOT)))
    return out


def where(found: dict[str, set[str]], names: list[str]) -> str:
    return "; ".join(f"{n} ({', '.join(sorted(found[n]))})" for n in names)


def test_every_named_path_exists() -> None:
    # a name followed by a pattern character (`tests/test_*.py`, `hosts/<host>`) is a pattern, not a path
    found = named(r"(?<![\w/.~$-])((?:" + "|".join(map(re.escape, TOP)) + r")/[\w./-]*[\w/])(?![\w*<{])")
    found |= named(r"(?<![\w/.~$-])((?:" + "|".join(SUBPACKAGES) + r")/[\w/]+\.py)\b")

    def exists(name: str) -> bool:
        return (ROOT / name).exists() or (ROOT / "politeproxy" / name).exists()

    missing = sorted(n for n in found if not exists(n))
    assert not missing, f"paths named in the docs that do not exist: {where(found, missing)}"


def setting_keys() -> set[str]:
    return {s.key.replace(".*.", ".<name>.") for s in SETTINGS}


def test_every_named_config_key_is_a_setting() -> None:
    dotted = named(r"^((?:" + "|".join(SECTIONS) + r")\.[a-z_<>]+(?:\.[a-z_]+)?)$")
    bracketed: dict[str, set[str]] = {}  # `[upstream] ca_file`: a section and a key
    for page in pages():
        for span in code_spans(page):
            m = re.fullmatch(r"\[(\w+)\] (\w+)", span)
            if m and m.group(1) in SECTIONS:
                bracketed.setdefault(f"{m.group(1)}.{m.group(2)}", set()).add(str(page.relative_to(ROOT)))
    found = dotted | bracketed
    keys = setting_keys()
    unknown = sorted(n for n in found if n not in keys)
    assert not unknown, (
        f"config keys named in the docs that the settings table lacks: {where(found, unknown)}"
    )


def code_metrics() -> set[str]:
    text = "\n".join(p.read_text() for p in (ROOT / "politeproxy" / "observe").glob("*.py"))
    return set(re.findall(r"\"(politeproxy_[a-z_]+)\"", text))


def base_metric(name: str) -> str:
    """The family a sample name belongs to: counters gain _total, histograms _bucket/_count/_sum."""
    return re.sub(r"_(total|bucket|count|sum|created)$", "", name)


def test_every_named_metric_is_exported_and_every_export_is_documented() -> None:
    found = named(r"\b(politeproxy_[a-z_]+)\b")
    exported = code_metrics()
    assert len(exported) >= 20, sorted(exported)  # the scan still finds the registrations
    unknown = sorted(n for n in found if n not in exported and base_metric(n) not in exported)
    assert not unknown, f"metrics named in the docs that the code does not export: {where(found, unknown)}"
    reference = (ROOT / "docs" / "metrics.md").read_text()
    undocumented = sorted(m for m in exported if not re.search(rf"\b{m}(_total)?\b", reference))
    assert not undocumented, f"metrics missing from docs/metrics.md: {undocumented}"


def code_variables() -> set[str]:
    text = "\n".join(p.read_text() for p in (ROOT / "politeproxy").rglob("*.py"))
    return set(re.findall(r"\b(POLITEPROXY_[A-Z_]+[A-Z])\b", text))


def test_every_named_variable_is_read_and_every_variable_is_documented() -> None:
    found = named(r"\b(POLITEPROXY_[A-Z_]+[A-Z])\b")
    read = code_variables()
    unknown = sorted(n for n in found if n not in read | TOOLING_VARS)
    assert not unknown, f"variables named in the docs that nothing reads: {where(found, unknown)}"
    commands_page = (ROOT / "docs" / "commands.md").read_text()
    undocumented = sorted(v for v in read if v not in commands_page)
    assert not undocumented, f"variables missing from docs/commands.md: {undocumented}"


def subcommands() -> set[str]:
    p = parser()
    action = next(a for a in p._actions if a.dest == "command")  # argparse keeps subparsers here
    return set(action.choices or ())


def test_every_named_command_exists_and_every_command_is_documented() -> None:
    # a command line: the name first, or after `$(` or a bin/ folder (log lines and prose name it otherwise)
    found = named(r"(?:^\s*(?:\$\s+)?|\$\(|\bbin/)politeproxy ([a-z][a-z-]*)\b")
    commands = subcommands()
    unknown = sorted(n for n in found if n not in commands)
    assert not unknown, f"politeproxy commands named in the docs that the CLI lacks: {where(found, unknown)}"
    commands_page = (ROOT / "docs" / "commands.md").read_text()
    undocumented = sorted(c for c in commands if f"`politeproxy {c}" not in commands_page)
    assert not undocumented, f"commands missing from docs/commands.md's table: {undocumented}"
