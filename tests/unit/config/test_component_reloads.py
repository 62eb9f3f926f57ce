"""Each reloadable component applies its own settings (reload(new)); App.reload only calls them, and the
restart-only warnings come from the table."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import pytest

from politeproxy.app import App
from politeproxy.config.loading import load
from politeproxy.pacing.base import PacingSettings
from politeproxy.policy.classify import DEFAULT_EXEMPT_RULES, Classifier, ExemptRule
from politeproxy.policy.hosts import HostSet
from politeproxy.policy.settings import RobotsSettings
from politeproxy.proxy.forwarding.robots_fetch import RobotsWatcher


def test_the_classifier_takes_new_rules() -> None:
    c = Classifier(HostSet(["*.example.org"]))
    assert c.classify("GET", "a.example.org", "/x/1", True) == "paced"
    c.reload((ExemptRule(host="*.example.org", path="/x/"),))
    assert c.classify("GET", "a.example.org", "/x/1", True) == "exempt"


def test_the_robots_watcher_takes_new_settings() -> None:
    w = RobotsWatcher(cast(Any, None), cast(Any, None))
    w.reload(RobotsSettings(enabled=False, ttl=5.0, max_crawl_delay=2.0))
    assert (w.enabled, w.ttl, w.cap) == (False, 5.0, 2.0)


class _Pacer:
    def __init__(self) -> None:
        self.settings = PacingSettings()
        self.got: list[PacingSettings] = []

    def reload(self, settings: PacingSettings) -> None:
        self.got.append(settings)
        self.settings = settings


def test_app_reload_hands_out_settings(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "pp.toml"
    path.write_text('[schedule]\nglobal_rate = "5/s"\n')
    app = App(load(path), str(path))
    pacer, app.classifier = _Pacer(), Classifier(HostSet())
    app.pacer = cast(Any, pacer)
    app.robots = RobotsWatcher(cast(Any, None), cast(Any, None))
    path.write_text(
        '[schedule]\nglobal_rate = "10/s"\nbackend = "memory"\n[client]\nidle_timeout = "5s"\n'
        '[robots]\nttl = "2m"\n[[exempt.rules]]\nhost = "x.example.org"\n'
    )
    with caplog.at_level(logging.WARNING, logger="politeproxy"):
        assert app.reload("test")
    assert pacer.got and pacer.got[-1].gap == pytest.approx(0.1)
    assert app.robots.ttl == 120.0
    assert app.classifier.rules[0].host == "x.example.org"  # added before the defaults, which stay
    assert app.classifier.rules[1:] == DEFAULT_EXEMPT_RULES
    warned = {r.getMessage() for r in caplog.records if "applies only after a restart" in r.getMessage()}
    assert warned == {
        "config reload: schedule.backend changed but applies only after a restart",
        "config reload: client.idle_timeout changed but applies only after a restart",
    }
