"""The parts' own settings, built from the typed sections of a loaded config (policy/table.py ``Sections``).

Each builder reads sections only: a key's value by its field (``s.pacing.max_wait``), and the settings
dataclasses fill their ``from_table`` fields by the key each names (``PacingSettings.of``), so no key is
mapped by hand here. What is left is what the table cannot say by itself: rule tables turned into rules,
the built-in rules kept or not, and the egress name that defaults to this machine's.
"""

from __future__ import annotations

import re
import socket

from politeproxy.pacing.base import PacingSettings
from politeproxy.policy.backoff import BackoffPolicy
from politeproxy.policy.cacherules import CacheLimits, CacheRule, default_rules
from politeproxy.policy.classify import DEFAULT_EXEMPT_RULES, ExemptRule
from politeproxy.policy.clients import DEFAULT_CLIENT_RULES, ClientRule
from politeproxy.policy.fairness import PipelineRule
from politeproxy.policy.hosts import S3_PATH_STYLE_HOSTS
from politeproxy.policy.table import DEFAULT_HOST_INTERVALS, Sections


def egress_default() -> str:
    """This machine's host name, as an egress name (anything else becomes ``-``)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:63].strip("-.")
    return name or "local"


def egress_name(s: Sections) -> str:
    """``[egress] name``, else this machine's host name (its valid characters only)."""
    return s.egress.name or egress_default()


def paced_hosts(s: Sections) -> list[str]:
    """paced_hosts, plus S3's own endpoints with intercept_s3_path_style (only /commoncrawl/ paced)."""
    path_style = list(S3_PATH_STYLE_HOSTS) if s.general.intercept_s3_path_style else []
    return list(s.general.paced_hosts) + path_style


def exempt_rules(s: Sections) -> tuple[ExemptRule, ...]:
    """[[exempt.rules]] added to the defaults (Common Crawl's parquet datasets), or in their place with
    ``exempt.keep_defaults = false``."""
    if s.exempt.rules is None:
        return DEFAULT_EXEMPT_RULES
    listed = tuple(
        ExemptRule(r["host"], r["path"], r["range_required"], tuple(r["methods"])) for r in s.exempt.rules
    )
    return listed + DEFAULT_EXEMPT_RULES if s.exempt.keep_defaults else listed


def client_rules(s: Sections) -> tuple[ClientRule, ...]:
    """[[clients.rules]] before the built-in rules, or alone with ``clients.keep_defaults = false``."""
    listed = tuple(ClientRule(r["user_agent"], r["max_wait"], "configured") for r in s.clients.rules or ())
    return listed + DEFAULT_CLIENT_RULES if s.clients.keep_defaults else listed


def host_intervals(s: Sections) -> tuple[tuple[str, float], ...]:
    """The [hosts] tables' intervals; without any [hosts] table, the built-in one (index.commoncrawl.org)."""
    if s.hosts is None:
        return DEFAULT_HOST_INTERVALS
    return tuple((h, t.interval) for h, t in s.hosts.items())


def pipelines(s: Sections) -> tuple[PipelineRule, ...]:
    return tuple(PipelineRule(name, t.weight, t.max_queued or None) for name, t in s.pipelines.items())


def pacing(s: Sections) -> PacingSettings:
    """What the pacer reads: its ``from_table`` fields by key, the rule tables built here."""
    return PacingSettings.of(
        s,
        client_rules=client_rules(s),
        backoff=BackoffPolicy.of(s),
        host_intervals=host_intervals(s),
        pipelines=pipelines(s),
        egress=egress_name(s),
    )


def cache(s: Sections) -> CacheLimits:
    """The cache's limits; [[cache.rules]] replace the default table."""
    c = s.cache
    rules = default_rules(c.collinfo_ttl)
    if c.rules is not None:
        rules = tuple(
            CacheRule(r["class"], tuple(r["hosts"]), tuple(r["paths"]), r["exact"], r["ttl"], r["ranges"])
            for r in c.rules
        )
    return CacheLimits.of(s, rules)
