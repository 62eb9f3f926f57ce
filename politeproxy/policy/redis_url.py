"""``schedule.redis_url``: which URLs are accepted, and how one is shown without its password.

Policy core (no I/O). A URL may carry the Redis password, so no message here ever contains it:
errors and log lines show ``mask_url(url)``.
"""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit

from politeproxy.policy.settings import ConfigError

SCHEMES = ("redis", "rediss", "unix")
MAX_URL = 2048


def _split(url: str) -> SplitResult | None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number from 0 to 65535
    except ValueError:
        return None
    return parts


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***``: ``redis://:***@redis:6379/0``."""
    parts = _split(url) if isinstance(url, str) and len(url) <= MAX_URL else None
    if parts is None:
        return "<an unreadable URL>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


def check_redis_url(url: object, key: str) -> str:
    """``url`` when redis-py can read it: ``redis://[[user]:password@]host[:port][/db]``, the same with
    ``rediss://`` (TLS), or ``unix://[[user]:password@]/path/to/socket[?db=N]``; else a ConfigError naming
    ``key`` (with the password masked)."""
    if not isinstance(url, str):
        raise ConfigError(f"{key}: expected a redis://, rediss:// or unix:// URL, got {type(url).__name__}")
    if len(url) > MAX_URL or not url.isprintable() or any(c.isspace() for c in url):
        raise ConfigError(f"{key}: expected a redis://, rediss:// or unix:// URL without spaces")
    parts = _split(url)
    if parts is None:
        raise ConfigError(f"{key}: {mask_url(url)}: not a URL with a valid port")
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        got = f"scheme {scheme!r}" if scheme else "no scheme"
        raise ConfigError(f"{key}: expected a redis://, rediss:// or unix:// URL, got {got}")
    if scheme == "unix":
        if not parts.path.startswith("/"):
            raise ConfigError(f"{key}: a unix:// URL needs an absolute socket path, unix:///run/redis.sock")
        return url
    if not parts.hostname:
        raise ConfigError(f"{key}: {mask_url(url)}: no host (redis://HOST:6379/0)")
    db = parts.path.lstrip("/")
    if db and not (db.isascii() and db.isdigit() and len(db) <= 5):
        raise ConfigError(f"{key}: {mask_url(url)}: the path is a database number, such as /0")
    return url


def redis_address(url: str) -> str:
    """Where a Redis URL points, password masked: ``redis://:***@redis:6379/0``, default port shown."""
    parts = _split(url)
    if parts is None or parts.scheme.lower() == "unix" or parts.port is not None or not parts.hostname:
        return mask_url(url)
    netloc = parts.netloc + ":6379"
    return mask_url(parts._replace(netloc=netloc).geturl())
