"""``politeproxy status --all``: one row per proxy from /status's ``proxies``; damage shows as "-"."""

from __future__ import annotations

from rich.console import Console

from politeproxy.observe.statusview import render


def text(doc: object) -> str:
    c = Console(width=200, record=True, no_color=True)
    c.print(render(doc, all_proxies=True))
    return c.export_text()


def test_one_row_per_proxy() -> None:
    doc = {
        "proxies": [
            {"id": "h:1:5", "listen": "127.0.0.1:8080", "version": "0.1.0", "self": True,
             "last_beat_s": 0.5, "uptime_s": 65, "queued": 3, "pipelines": [{"pipeline": "a", "queued": 3}],
             "pipelines_omitted": 2},
            {"id": "h:2:6", "listen": "127.0.0.1:8081", "version": "0.1.0", "queued": 0, "pipelines": []},
        ]
    }  # fmt: skip
    out = text(doc)
    assert "h:1:5 (this one)" in out and "127.0.0.1:8081" in out and "a 3, +2 more" in out
    assert "pipelines" in out and "hosts" not in out.split("proxies sharing")[1]


def test_damage_never_raises() -> None:
    for doc in ({}, {"proxies": "x"}, {"proxies": [None, 3, {"pipelines": "y", "id": ["z"]}]}):
        assert "proxies sharing the store" in text(doc)
