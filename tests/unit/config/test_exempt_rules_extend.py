"""[[exempt.rules]] add to the default rules (issue 24 item 3): a user who exempts their own dataset keeps
the exemption of Common Crawl's parquet datasets; ``exempt.keep_defaults = false`` replaces them."""

from __future__ import annotations

from politeproxy.config.loading import build
from politeproxy.policy.classify import DEFAULT_EXEMPT_RULES, Classifier, Klass
from politeproxy.policy.hosts import HostSet

RULE = {"host": "data.commoncrawl.org", "path": "/projects/my-dataset/"}


def classifier(raw: dict[str, object]) -> Classifier:
    cfg = build(raw)
    return Classifier(HostSet(cfg.paced_hosts), cfg.exempt_rules())


def test_listed_rules_add_to_the_defaults() -> None:
    c = classifier({"exempt": {"rules": [RULE]}})
    assert c.rules[1:] == DEFAULT_EXEMPT_RULES
    assert c.classify("GET", "data.commoncrawl.org", "/projects/my-dataset/a.parquet", True) is Klass.EXEMPT
    table = "/cc-index/table/cc-main/warc/part-0.parquet"
    assert c.classify("GET", "data.commoncrawl.org", table, True) is Klass.EXEMPT  # the default stays
    assert c.classify("GET", "index.commoncrawl.org", table, True) is Klass.PACED  # the index keeps its pace


def test_keep_defaults_false_replaces_them() -> None:
    c = classifier({"exempt": {"rules": [RULE], "keep_defaults": False}})
    assert len(c.rules) == 1
    table = "/cc-index/table/cc-main/warc/part-0.parquet"
    assert c.classify("GET", "data.commoncrawl.org", table, True) is Klass.PACED


def test_no_rules_means_the_defaults() -> None:
    assert classifier({}).rules == DEFAULT_EXEMPT_RULES
