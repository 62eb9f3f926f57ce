"""``politeproxy config init``'s file: every key of the table of settings, commented out at its default.

Rendered from policy/table.py like the reference (config/reference.py), so it never disagrees with the code:
a line ``# key = value`` is the key at its default, ready to uncomment; a line ``## ...`` says what it does.
tests/unit/config/test_template.py uncomments every key and loads the file: it must give the defaults.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from politeproxy.config.reference import _size
from politeproxy.policy.settings import format_duration
from politeproxy.policy.table import SETTINGS, Setting

HEAD = """## politeproxy's config file, written by `politeproxy config init`.
## Every key is at its default, commented out: uncomment a line to change it. The proxy rereads this file
## when it changes (keys marked "restart" apply after a restart). Reference: docs/configuration.md.
"""
EXAMPLES = """
## [hosts."index.commoncrawl.org"]       # a [hosts] table replaces the default (index.commoncrawl.org 1s)
## interval = "1s"
## [pipelines.urls]                      # a pipeline's share, cap and secret (docs/pacing.md)
## weight = 2
## max_queued = 500
## token_env = "PP_TOKEN_URLS"
"""


def default_path(env: dict[str, str] | os._Environ[str] = os.environ) -> Path:
    """Where the config is looked for when neither --config nor POLITEPROXY_CONFIG names one."""
    base = env.get("XDG_CONFIG_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".config")
    return Path(base) / "politeproxy" / "politeproxy.toml"


def toml_value(s: Setting, v: Any) -> str | None:
    """A default as TOML, or None where the default is built in (a table of rules)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return "true" if v else "false"
    if s.kind in ("duration", "rate"):
        return json.dumps(format_duration(v) if v else "0s")
    if s.kind == "size":
        return json.dumps(_size(int(v)))
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, tuple):
        return "[" + ", ".join(json.dumps(x) for x in v) + "]"
    if isinstance(v, dict):
        pairs = ", ".join(f"{json.dumps(k)} = {json.dumps(x)}" for k, x in v.items())
        return "{ " + pairs + " }" if v else "{}"
    return str(v)


def _line(s: Setting, name: str) -> str:
    value = toml_value(s, s.default)
    applies = "" if s.reload else " (restart)"
    doc = f"## {s.doc}{applies}\n"
    if value is None:
        return doc + f"## {name}: built in, see docs/configuration.md\n"
    return doc + f"# {name} = {value}\n"


def render() -> str:
    """The whole commented file."""
    out = [HEAD, "\n"]
    sections: dict[str, list[Setting]] = {}
    for s in SETTINGS:
        if "*" in s.key:
            continue
        if "." not in s.key:
            out.append(_line(s, s.key))
        else:
            sections.setdefault(s.key.split(".", 1)[0], []).append(s)
    for section, settings in sections.items():
        out.append(f"\n# [{section}]\n")
        out.extend(_line(s, s.key.split(".", 1)[1]) for s in settings)
    out.append(EXAMPLES)
    return "".join(out)
