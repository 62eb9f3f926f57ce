"""``politeproxy config init``'s file (issue 26 item 4): every key commented out at its default. With every
key uncommented it loads, and gives exactly the defaults: the template cannot drift from the table."""

from __future__ import annotations

import tomllib
from pathlib import Path

from politeproxy.config.loading import build
from politeproxy.config.template import default_path, render
from politeproxy.policy.table import SETTINGS


def uncommented(text: str) -> str:
    return "\n".join(ln[2:] if ln.startswith("# ") else ln for ln in text.splitlines())


def test_every_key_uncommented_loads_to_the_defaults() -> None:
    text = render()
    raw = tomllib.loads(uncommented(text))
    assert build(raw).raw == build({}).raw
    for s in SETTINGS:
        if "*" not in s.key:
            assert s.key.split(".")[-1] in text, s.key


def test_as_written_it_is_an_empty_config() -> None:
    assert tomllib.loads(render()) == {}


def test_the_default_place_follows_xdg() -> None:
    assert default_path({"XDG_CONFIG_HOME": "/x"}) == Path("/x/politeproxy/politeproxy.toml")
    assert default_path({"HOME": "/home/u"}) == Path("/home/u/.config/politeproxy/politeproxy.toml")
