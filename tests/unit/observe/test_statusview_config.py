"""``politeproxy status`` names the config file read, or says that none was (issue 45 item 3)."""

from __future__ import annotations

from rich.console import Console

from politeproxy.observe.statusview import render


def text(doc: object) -> str:
    c = Console(width=200, record=True, no_color=True)
    c.print(render(doc))
    return c.export_text()


def test_the_file_read_or_the_defaults() -> None:
    assert "config: /etc/pp.toml" in text({"config": {"path": "/etc/pp.toml", "read": True}})
    assert "config: no config file (defaults)" in text(
        {"config": {"path": "/home/me/pp.toml", "read": False}}
    )
    assert "config: no config file (defaults)" in text({})  # an older proxy's document says nothing of it


def test_a_path_is_shown_without_control_characters() -> None:
    out = text({"config": {"path": "/tmp/a\x1b[2Jb.toml", "read": True}})
    assert "\x1b" not in out and "a?[2Jb.toml" in out
    for doc in ({"config": "x"}, {"config": {"path": ["x"], "read": "yes"}}, {"config": None}):
        text(doc)  # damage never raises
