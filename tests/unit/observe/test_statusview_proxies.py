"""``politeproxy status --all``: one row per proxy from /status's ``proxies``; damage shows as "-"."""

from __future__ import annotations

from rich.console import Console

from politeproxy.observe.statusview import render


def text(doc: object, all_proxies: bool = True) -> str:
    """The terminal view as plain text (``politeproxy status``, ``--all`` unless told otherwise)."""
    c = Console(width=200, record=True, no_color=True)
    c.print(render(doc, all_proxies=all_proxies))
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


def test_one_row_per_worker_and_none_for_a_single_process() -> None:
    doc = {
        "workers": [
            {"worker": 0, "answering": True, "pid": 4242, "restarts": 1, "uptime_s": 65,
             "achieved_rate": 4.5, "grants_since_start": 90, "queued": 3, "exempt_in_flight": 0},
            {"worker": 1, "answering": False},
        ]
    }  # fmt: skip
    out = text(doc, all_proxies=False)
    part = out.split("workers (the lines above are their sum)")[1]
    assert "4242" in part and "4.50/s" in part and "1m05s" in part and "NOT ANSWERING" in part
    assert "workers (" not in text({"overall": {}}, all_proxies=False)  # one process: no workers table


def test_damaged_workers_never_raise() -> None:
    for doc in ({"workers": "x"}, {"workers": [None, 3, {"pid": "9\x1b[2J", "worker": ["z"]}]}):
        text(doc, all_proxies=False)
