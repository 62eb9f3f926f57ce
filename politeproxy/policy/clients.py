"""Hold bounds that fit each client: rules matched on the User-Agent (policy core, no I/O).

A request held longer than its client's read timeout is lost: the client gives up, retries (another slot),
and the slot the proxy kept for it goes unused. One ``pacing.max_wait`` for every client is too short for
some (botocore waits 60 s for a first byte) and too long for others (duckdb's ``http_timeout`` is 30 s). A
rule names a prefix of the User-Agent and the longest the proxy may hold that client's request; a client no
rule matches gets ``pacing.max_wait``. The first rule that matches wins; ``[[clients.rules]]`` come before
the built-in ones, so a configured rule overrides a default of the same prefix.

The built-in rules hold each client up to a margin under its own default read timeout (docs/tools.md gives
each timeout's source)::

    bound = bound_for(rules, "Boto3/1.44.8 md/Botocore#1.44.18 ...", default=25.0)   # 55.0
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

MAX_USER_AGENT = 256  # characters of a User-Agent a rule is matched against (client-chosen, bounded)
MAX_RULES = 64


@dataclass(frozen=True, slots=True)
class ClientRule:
    """Requests whose User-Agent starts with ``user_agent`` are held at most ``max_wait`` seconds."""

    user_agent: str
    max_wait: float
    why: str = ""  # the client's own timeout and its source, for the docs


# botocore's read timeout is 60 s (botocore/endpoint.py DEFAULT_TIMEOUT), for boto3, the AWS CLI and
# aiobotocore (s3fs) alike; duckdb's http_timeout is 30 s (httpfs); cdx_toolkit asks with timeout=(30, 30)
# (cdx_toolkit/myrequests.py); the AWS SDK for Java 2.x reads for 30 s by default, 1.x for 50 s.
DEFAULT_CLIENT_RULES: tuple[ClientRule, ...] = (
    ClientRule("Boto3/", 55.0, "botocore read_timeout 60 s"),
    ClientRule("Botocore/", 55.0, "botocore read_timeout 60 s"),
    ClientRule("aws-cli/", 55.0, "botocore read_timeout 60 s (the AWS CLI's cli_read_timeout)"),
    ClientRule("aiobotocore/", 55.0, "aiobotocore read_timeout 60 s (s3fs)"),
    ClientRule("duckdb/", 25.0, "duckdb http_timeout 30 s"),
    ClientRule("pypi_cdx_toolkit/", 25.0, "cdx_toolkit requests timeout (30 s, 30 s)"),
    ClientRule("aws-sdk-java/2.", 25.0, "AWS SDK for Java 2.x read timeout 30 s"),
    ClientRule("aws-sdk-java/1.", 45.0, "AWS SDK for Java 1.x socket timeout 50 s"),
)


def bound_for(rules: tuple[ClientRule, ...], user_agent: str | None, default: float) -> float:
    """The hold bound of a request with ``user_agent``: the first matching rule's, else ``default``."""
    if not user_agent or not rules:
        return default
    found = _match(rules, user_agent[:MAX_USER_AGENT])
    return default if found is None else found


@lru_cache(maxsize=1024)  # asked per request; bounded: user agents are client-chosen
def _match(rules: tuple[ClientRule, ...], user_agent: str) -> float | None:
    for r in rules:
        if user_agent.startswith(r.user_agent):
            return r.max_wait
    return None


def sdk_attempt(value: str | None) -> int:
    """Which try of one operation a request is, from an AWS SDK's ``amz-sdk-request`` header
    (``attempt=2; max=3``, maybe with a ``ttl=``); 0 when absent or unreadable. Never raises.

    A retry of a refused request (attempt 2 and later) goes ahead of first tries in its line (issue 41): the
    proxy told it when to come back, and behind the first tries that came meanwhile it would be refused again
    until its client's attempts ran out."""
    if not value or len(value) > MAX_USER_AGENT:
        return 0
    for part in value.split(";"):
        name, sep, number = part.strip().partition("=")
        if sep and name.strip().lower() == "attempt":
            number = number.strip()
            return int(number) if number.isdigit() and len(number) <= 4 else 0
    return 0
