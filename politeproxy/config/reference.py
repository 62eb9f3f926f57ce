"""The configuration reference, docs/configuration.md, rendered from the table of settings (policy/table.py).

Regenerate it after a change to the table:

    .venv/bin/python -m politeproxy.config.reference docs/configuration.md

tests/unit/config/test_reference.py fails while the file and the table disagree.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from politeproxy.policy.settings import format_duration, format_rate
from politeproxy.policy.table import SETTINGS, Setting

COMMAND = ".venv/bin/python -m politeproxy.config.reference docs/configuration.md"

_HEAD = f"""# Configuration reference

<!-- Generated from politeproxy/policy/table.py; do not edit. Regenerate with: {COMMAND} -->

One TOML file (`--config`, or `POLITEPROXY_CONFIG`). Every key is optional; an unknown key or a wrong
type is an error naming the key. `[section] key` is written `section.key` below; `<name>` stands for a
table's name (`[hosts."index.commoncrawl.org"] interval`). Durations need a unit (`"200ms"`, `"1.5s"`,
`"5m"`); keys of kind *rate* also take a rate (`"5/s"` = a 200 ms gap). *restart*: a reload that changes
the key says so, and it applies only after a restart. Flags win over variables, variables over the file.

| key | kind | default | bounds | applies | flag / env | meaning |
| --- | --- | --- | --- | --- | --- | --- |
"""


def _size(n: int) -> str:
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _value(s: Setting, v: Any) -> str:
    """A value as the config file would write it."""
    if v is None:
        return "built in (see meaning)"
    if isinstance(v, bool):
        return "`true`" if v else "`false`"
    if s.kind in ("duration", "rate"):
        if not v:
            return "`0` (off)" if s.kind == "rate" else "`0`"
        rate = f' (= `"{format_rate(v)}"`)' if s.kind == "rate" else ""
        return f'`"{format_duration(v)}"`{rate}'
    if s.kind == "size":
        return f'`"{_size(v)}"`'
    if isinstance(v, str):
        return f'`"{v}"`'
    if isinstance(v, tuple):
        items = [f'"{x}"' if isinstance(x, str) else str(x) for x in v]
        more = f", ... ({len(items)} in all)" if len(items) > 3 else ""
        return f"`[{', '.join(items[:3])}{more}]`"
    if isinstance(v, dict):
        return f"`{v or '{}'}`"
    return f"`{v}`" if isinstance(v, int) else f"`{v:g}`"


def _bounds(s: Setting) -> str:
    if s.bounds is None:
        return ""
    lo, hi = s.bounds
    if s.kind in ("duration", "rate"):
        return f"{format_duration(lo) if lo else '0'} to {format_duration(hi)}"
    if s.kind == "size":
        return f"{_size(int(lo))} to {_size(int(hi))}"
    return f"{lo:,} to {hi:,}" if isinstance(lo, int) else f"{lo:g} to {hi:g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(s: Setting) -> str:
    key = s.key.replace("*", "<name>")
    kind = f"{s.kind}: {', '.join(s.choices)}" if s.choices else s.kind
    default = _value(s, s.default)
    outside = ", ".join(f"`{x}`" for x in (s.flag, s.env) if x)
    cells = [f"`{key}`", kind, default, _bounds(s), "reload" if s.reload else "*restart*", outside, s.doc]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def render(settings: Iterable[Setting] = SETTINGS) -> str:
    """The whole Markdown document for ``settings``."""
    return _HEAD + "".join(_row(s) + "\n" for s in settings)


def main(argv: list[str]) -> int:
    text = render()
    if not argv:
        sys.stdout.write(text)
        return 0
    with open(argv[0], "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
