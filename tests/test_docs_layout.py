"""The docs' shape (issue 23, issue 26): the module tree in docs/architecture.md names every module of the
package, under its own folder, and no module that is gone; README.md stays a front page of at most 8 KB;
every relative link in README.md and docs/*.md points at a file that exists (and, for a link into a
Markdown page, at a heading that exists). mkdocs --strict checks docs/ too, in `make docs`; this test also
covers README.md, which mkdocs does not build, and runs in the quick suite."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.processes import ROOT

PACKAGE = ROOT / "politeproxy"
LAYOUT_PAGE = ROOT / "docs" / "architecture.md"
README_LIMIT = 8 * 1024  # bytes: the front page a newcomer reads in five minutes (DESIGN.md, "Docs")


def layout_block() -> str:
    text = LAYOUT_PAGE.read_text()
    start = text.index("```\npoliteproxy/", text.index("## Layout")) + 4
    return text[start : text.index("\n```", start)]


def documented() -> set[str]:
    """Every ``folder/module.py`` (or top-level ``module.py``) the tree names, by its indentation: two
    spaces a level, a folder a name ending in ``/`` (``proxy/`` holds folders of its own)."""
    found, folders = set(), {}  # folders: {indent: the folder a line at that indent opens}
    for line in layout_block().splitlines()[1:]:
        indent = len(line) - len(line.lstrip())
        name = line.split()[0] if line.strip() else ""
        folders = {i: f for i, f in folders.items() if i < indent}
        if name.endswith("/"):
            folders[indent] = name
            continue
        prefix = "".join(folders[i] for i in sorted(folders))
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
    missing = sorted(modules() - documented())
    assert not missing, (
        f"{len(missing)} module(s) missing from the layout tree in {LAYOUT_PAGE.relative_to(ROOT)} "
        f"(## Layout): {', '.join(missing)}; add one line each under its folder"
    )


def test_the_layout_tree_names_no_module_that_is_gone() -> None:
    gone = sorted(documented() - modules())
    assert not gone, (
        f"the layout tree in {LAYOUT_PAGE.relative_to(ROOT)} names modules that do not exist: {gone}"
    )


def test_the_readme_is_a_front_page() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes, over {README_LIMIT}: move the detail into docs/"


def pages() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) gives a heading: lower case, markup and punctuation dropped,
    spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[-\s]+", "-", text).strip("-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m) for m in re.findall(r"^#{1,6} (.+?)\s*$", text, flags=re.M)}


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code is not a link
    text = re.sub(r"`[^`\n]*`", "", text)
    return [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_every_relative_link_resolves() -> None:
    broken = []
    for page in pages():
        if not page.exists():
            continue
        for target in relative_links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "links that do not resolve:\n" + "\n".join(broken)
