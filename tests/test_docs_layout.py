"""The README's layout tree names every module of the package, under its own folder, and no module that is
gone: the map a newcomer reads is the tree (issue 23, "the docs' layout section matches the tree")."""

from __future__ import annotations

import re

from tests.support.processes import ROOT

PACKAGE = ROOT / "politeproxy"


def layout_block() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("```\npoliteproxy/", text.index("## Layout")) + 4
    return text[start : text.index("\n```", start)]


def documented() -> set[str]:
    """Every ``folder/module.py`` (or top-level ``module.py``) the tree names, by its indentation."""
    found, folder = set(), ""
    for line in layout_block().splitlines()[1:]:
        indent = len(line) - len(line.lstrip())
        name = line.split()[0] if line.strip() else ""
        if indent == 2 and name.endswith("/"):
            folder = name
            continue
        prefix = folder if indent == 4 else ""
        first_column = re.split(r"\s{2,}", line.strip())[0]  # the names, not the description
        for module in re.findall(r"\b([a-z_0-9]+\.py)\b", first_column):
            found.add(prefix + module)
    return found


def modules() -> set[str]:
    return {
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py")
    }


def test_every_module_is_in_the_layout_tree() -> None:
    missing = modules() - documented()
    assert not missing, f"add to README.md's layout tree: {sorted(missing)}"


def test_the_layout_tree_names_no_module_that_is_gone() -> None:
    gone = documented() - modules()
    assert not gone, f"the layout tree names modules that do not exist: {sorted(gone)}"
