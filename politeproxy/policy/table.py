# ruff: noqa: E501 - one line per setting, so that adding one is one line
"""THE table of settings: one line per config key (policy core, pure data, no I/O).

Each TOML section is a class below, and each of its keys one line: a typed field whose value is the key's
``S(...)`` entry (kind, default, doc, bounds, reload, env, flag). The ``section`` decorator makes the class a
frozen, keyword-only dataclass whose defaults are the table's, and records the entries in ``SETTINGS``, from
which everything else is derived: the TOML schema and its checks (config/loading.py), the environment and flag
overrides (config/overrides.py, commands/cli.py), the restart-only list, the reference in
docs/configuration.md (config/reference.py) and the typed ``Sections`` a loaded config hands to each part.

Adding a setting is one line in its section here, plus the code that reads it (``sections.<section>.<key>``)
and its test; docs/architecture.md, "Adding a setting". ``kind`` names a converter (policy/values.py
``CONVERTERS``; the four kinds of nested tables are config/loading.py's). A section named ``hosts.*`` is one
entry of a table keyed by a name (``hosts.<pattern>.interval``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, TypeVar

from politeproxy.policy.hosts import DEFAULT_PACED_HOSTS
from politeproxy.policy.tabledef import Rules as Rules
from politeproxy.policy.tabledef import S, is_section, section, table_of
from politeproxy.policy.tabledef import Setting as Setting
from politeproxy.policy.tabledef import freeze as freeze

DAY = 86400.0
MIN, HOUR = 60.0, 3600.0
SIZE_BOUNDS = (0, 1 << 50)  # bytes; a petabyte is already a typo

_T = TypeVar("_T")


# fmt: off
_D = "s"  # the unit of every duration and rate


@section("")
class GeneralSection:
    """the top-level keys"""

    listen: str = S("host:port", default="127.0.0.1:3128", doc="where clients connect; a non-loopback address needs allow_clients or [auth] users", env="POLITEPROXY_LISTEN", flag="--listen", flag_all=True)
    data_dir: str = S("path", default="", doc="CA, schedule and cache; empty: $XDG_DATA_HOME/politeproxy, else ~/.local/share/politeproxy", env="POLITEPROXY_DATA_DIR", flag="--data-dir", flag_all=True)
    allow_clients: tuple[str, ...] = S("cidr list", default=(), doc="CIDRs allowed besides loopback; others get 403")
    metrics_listen: str = S("host:port or empty", default="", doc="also serve /metrics and /healthz on this address", flag="--metrics-listen")
    workers: int | str = S("count or auto", default=1, doc="processes serving the one port (SO_REUSEPORT) on one data dir and store; auto: one per core; needs the file or redis store", bounds=(1, 256), flag="--workers")
    log_format: str = S("choice", default="plain", doc="log lines: plain, or one JSON object per line", flag="--log-format", choices=("plain", "json"))
    paced_hosts: tuple[str, ...] = S("host patterns", default=DEFAULT_PACED_HOSTS, doc="host patterns intercepted and paced (*.x: any subdomain of x)")
    tunnel_ports: tuple[int, ...] = S("ports", default=(443,), doc="ports a CONNECT may reach; others get 403", bounds=(1, 65535))
    allow_private_destinations: bool = S("bool", default=False, doc="let non-loopback clients reach loopback, link-local and this host's addresses")
    allow_ip_connect: bool = S("bool", default=False, doc="tunnel a CONNECT (or send a plain http:// request) to an IP literal when no paced name resolves to the address; off: refused, no name to pace or sign for")
    admin_hosts: tuple[str, ...] = S("names", default=("politeproxy", "politeproxy.politeproxy.svc", "politeproxy.politeproxy.svc.cluster.local"), doc="Host names the admin paths answer besides IP addresses, localhost, this machine's name and the listen address (a DNS-rebinding guard)")
    intercept_s3_path_style: bool = S("bool", default=False, doc="also intercept s3[.<region>].amazonaws.com and pace only /commoncrawl/ there")


@section("admin")
class AdminSection:
    """[admin]"""

    token_env: str = S("string", default="", doc="the environment variable that holds a token POST /release must carry (Authorization: Bearer TOKEN; politeproxy release sends it from the same variable); empty: no token. Recommended where others share the machine or the allowed networks")
    token_file: str = S("string", default="", doc="a file whose first line is that token, instead of token_env (~ expanded)")


@section("auth")
class AuthSection:
    """[auth]"""

    users: Mapping[str, str] = S("users", default={}, doc='{ name = "password" }: require Proxy-Authorization: Basic (else 407)', env="POLITEPROXY_AUTH_USERS")


@section("client")
class ClientSection:
    """[client]"""

    handshake_timeout: float = S("duration", default=10.0, doc="TLS handshake with a client", bounds=(0.0, HOUR), unit=_D)
    header_timeout: float = S("duration", default=15.0, doc="the first request head on a connection", bounds=(0.0, HOUR), unit=_D)
    idle_timeout: float = S("duration", default=60.0, doc="idle keep-alive connections and blind tunnels are closed after it", bounds=(0.0, DAY), unit=_D)
    max_header_size: int = S("int", default=32768, doc="bytes per request head; a larger one gets 431", bounds=(1024, 1 << 20), unit="bytes")
    max_connections: int = S("int", default=4096, doc="client connections open at once, tunnels included; one more gets 503", bounds=(1, 1_000_000))


@section("upstream")
class UpstreamSection:
    """[upstream]"""

    ca_file: str = S("path", default="", doc="extra trust anchors for upstream TLS (a PEM file, added to the usual ones); resolved like data_dir", env="POLITEPROXY_UPSTREAM_CA", flag="--upstream-ca")
    resolve: Mapping[str, str] = S("resolve table", default={}, doc='{ "host:port" = "ip:port" }, like curl --resolve')
    connect_timeout: float = S("duration", default=10.0, doc="504 when exceeded, 502 when refused", bounds=(0.0, 600.0), unit=_D)
    read_timeout: float = S("duration", default=60.0, doc="between reads from upstream", bounds=(0.0, DAY), unit=_D)
    max_connections: int = S("int", default=256, doc="upstream connections in use at once, shared out per class", bounds=(1, 100_000))


@section("schedule")
class ScheduleSection:
    """[schedule]"""

    backend: str = S("choice", default="file", doc="where the shared schedule lives", choices=("memory", "file", "redis"))
    global_rate: float = S("rate", default=0.2, doc='the gap between paced grants across all paced requests ("200ms"), or a rate ("5/s", "300/m"); 0 = off', bounds=(0.0, HOUR), unit=_D, reload=True, env="POLITEPROXY_GLOBAL_RATE", flag="--global-rate")
    redis_url: str = S("redis url", default="redis://127.0.0.1:6379/0", doc="redis://, rediss:// or unix://; the password is never logged", env="POLITEPROXY_REDIS_URL")
    redis_prefix: str = S("string", default="politeproxy:", doc="key prefix: one budget per prefix")
    redis_key_ttl: float = S("duration", default=DAY, doc="how long idle keys live", bounds=(MIN, 30 * DAY), unit=_D)
    expected_proxies: int = S("int", default=1, doc="floor of the gap multiplier while the shared store is down (else the live proxies last seen)", bounds=(1, 1000))


@section("egress")
class EgressSection:
    """[egress]"""

    name: str = S("egress name", default="", doc="the name Common Crawl counts requests under (one IP): proxies sharing a store and this name share one request window; give every machine behind one NAT the same name; empty: this machine's host name", env="POLITEPROXY_EGRESS_NAME")
    window: float = S("duration", default=300.0, doc="the trailing window requests are counted in (Common Crawl's WAF blocks an IP above 6,000 requests in 300 s)", bounds=(1.0, DAY), unit=_D, reload=True)
    limit: int = S("int", default=4800, doc="requests per window per service, every class together (80% of Common Crawl's 6,000); 0 turns the window off, with a warning at start", bounds=(0, 10_000_000), reload=True)


@section("pacing")
class PacingSection:
    """[pacing]"""

    max_wait: float = S("duration", default=25.0, doc="longest a request is held; beyond it 503 + Retry-After", bounds=(0.0, HOUR), unit=_D, reload=True)
    retries: int = S("int", default=2, doc="transparent retries of a throttled GET/HEAD", bounds=(0, 10), reload=True)
    max_queue: int = S("int", default=1024, doc="requests one proxy holds waiting at most (paced and exempt)", bounds=(1, 1_000_000), reload=True)
    throttle_codes: tuple[int, ...] = S("status codes", default=(429, 500, 503), doc='answers that mean "slow down" (backoff, retry)', reload=True)
    backoff_base: float = S("duration", default=1.0, doc="first backoff without Retry-After", bounds=(0.0, HOUR), unit=_D, reload=True)
    backoff_cap: float = S("duration", default=300.0, doc="the longest backoff, Retry-After included", bounds=(0.0, DAY), unit=_D, reload=True)
    backoff_jitter: float = S("float", default=0.2, doc="a backoff grows by up to this fraction", bounds=(0.0, 1.0), reload=True)
    index_rest: float = S("duration", default=60.0, doc="after a 502, 503, 504, reset or empty reply from the index server, no request goes to it for this long (or Retry-After, or the backoff, if longer), doubled per warning in a row; 0: off", bounds=(0.0, DAY), unit=_D, reload=True)
    block_codes: tuple[int, ...] = S("status codes", default=(403,), doc="answers that block the host (hold, then one probe)", reload=True)
    block_hold: float = S("duration", default=120.0, doc="the first hold after a block, doubled per consecutive block", bounds=(0.0, DAY), unit=_D, reload=True)
    block_hold_cap: float = S("duration", default=1800.0, doc="the longest hold (at least block_hold)", bounds=(0.0, DAY), unit=_D, reload=True)
    adaptive: bool = S("bool", default=True, doc="raise a host's interval on throttles and blocks (AIMD)", reload=True)
    adaptive_floor: float = S("rate", default=1.0, doc="the raised interval is at least this", bounds=(0.0, HOUR), unit=_D, reload=True)
    adaptive_recovery: float = S("duration", default=60.0, doc="back to the configured interval in 4 steps over this", bounds=(0.0, DAY), unit=_D, reload=True)


@section("clients")
class ClientsSection:
    """[clients]"""

    rules: Rules = S("client rules", default=None, doc='[[clients.rules]] user_agent (a prefix of the User-Agent), max_wait: the hold bound of the clients it matches, in place of pacing.max_wait; before the built-in rules (boto3, the AWS CLI, aiobotocore/s3fs: 55s; duckdb, cdx_toolkit: 25s; the AWS SDK for Java)', reload=True)
    keep_defaults: bool = S("bool", default=True, doc="keep the built-in client rules after [[clients.rules]]; false: only the listed rules", reload=True)


@section("robots")
class RobotsSection:
    """[robots]"""

    enabled: bool = S("bool", default=True, doc="fetch robots.txt per paced host and honour Crawl-delay", reload=True)
    ttl: float = S("duration", default=HOUR, doc="how long a robots.txt answer is trusted", bounds=(0.0, 30 * DAY), unit=_D, reload=True)
    max_crawl_delay: float = S("duration", default=10.0, doc="the most a Crawl-delay can raise a host's interval", bounds=(0.0, HOUR), unit=_D, reload=True)


@section("exempt")
class ExemptSection:
    """[exempt]"""

    max_in_flight: int = S("int", default=16, doc="exempt requests in flight per service (every name of the bucket together), per proxy", bounds=(1, 10_000), reload=True)
    respect_backoff: bool = S("bool", default=True, doc="exempt requests wait out a host's active backoff", reload=True)
    rate: float = S("rate", default=0.1, doc="GCRA ceiling of exempt reads per service (every name of the bucket together), shared through the store; 0 = none", bounds=(0.0, 60.0), unit=_D, reload=True)
    burst: int = S("int", default=90, doc="exempt reads that may go at once before the rate applies", bounds=(1, 100_000), reload=True)
    rules: Rules = S("exempt rules", default=None, doc="[[exempt.rules]] host, path, range_required, methods; added to the defaults (range reads and HEAD under /cc-index/table/ and /projects/host-index* on data.commoncrawl.org and the bucket's names)", reload=True)
    keep_defaults: bool = S("bool", default=True, doc="keep the default exempt rules beside [[exempt.rules]]; false: the listed rules replace them", reload=True)


@section("hosts.*")
class HostSection:
    """one [hosts.<name>] table"""

    interval: float = S("rate", default=0.0, doc="least interval between grants to a host; any [hosts] table replaces the default (index.commoncrawl.org 1s)", bounds=(0.0, HOUR), unit=_D, reload=True)


@section("pipelines.*")
class PipelineSection:
    """one [pipelines.<name>] table"""

    weight: float = S("float", default=1.0, doc="a pipeline's share relative to others", bounds=(0.01, 1000.0), reload=True)
    token_env: str = S("string", default="", doc="the environment variable that holds this pipeline's secret (never the secret itself): a client naming the pipeline must send it as the proxy password (http://NAME:SECRET@host:port), or counts as the guest pipeline NAME~guest")
    token_file: str = S("string", default="", doc="a file whose first line is the secret, instead of token_env (~ expanded)")
    max_queued: int = S("int", default=0, doc="requests of this pipeline waiting at once; 0 = no cap", bounds=(0, 1_000_000), reload=True)


@section("cache")
class CacheSection:
    """[cache]"""

    enabled: bool = S("bool", default=True, doc="the shared disk cache of immutable objects")
    max_object: int = S("size", default=64 << 20, doc="largest 200 body kept", bounds=SIZE_BOUNDS, unit="bytes")
    max_range: int = S("size", default=16 << 20, doc="largest 206 body kept", bounds=SIZE_BOUNDS, unit="bytes")
    max_size: int = S("size", default=2 << 30, doc="total on disk; least recently used entries are evicted beyond it", bounds=SIZE_BOUNDS, unit="bytes")
    collinfo_ttl: float = S("duration", default=DAY, doc="how long collinfo.json is served before it is fetched again", bounds=(0.0, 30 * DAY), unit=_D)
    index_answers: bool = S("bool", default=True, doc="keep the index server's CDX API answers for crawls collinfo.json lists (immutable once published), under the exact query; false: every index query goes upstream")
    index_miss_ttl: float = S("duration", default=DAY, doc="how long pywb's \"No Captures found\" 404 for a published crawl is kept; 0: never", bounds=(0.0, 30 * DAY), unit=_D)
    index_redis_max_answer: int = S("size", default=8 << 20, doc="on the redis store, kept index answers also live in Redis (shared by proxies with data dirs of their own): the largest kept there", bounds=SIZE_BOUNDS, unit="bytes")
    index_redis_max_size: int = S("size", default=256 << 20, doc="on the redis store, the total of kept index answers in Redis; the oldest go first beyond it", bounds=SIZE_BOUNDS, unit="bytes")
    rules: Rules = S("cache rules", default=None, doc="[[cache.rules]] class, hosts, paths, exact, ttl, ranges; replaces the default table")
# fmt: on

# Every section class and its table name, in the order they are declared above.
SECTION_CLASSES: dict[type, str] = {c: table_of(c)[0] for c in list(globals().values()) if is_section(c)}
SETTINGS: tuple[Setting, ...] = tuple(e for c in SECTION_CLASSES for e in table_of(c)[1])
BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}


@dataclass(frozen=True, slots=True, kw_only=True)
class Sections:
    """Every section of one loaded config, typed and frozen: built once per load (and reload), then handed
    to each part by keyword. ``Sections()`` is the table's defaults. ``hosts`` is None without a [hosts]
    table (the built-in intervals apply)."""

    general: GeneralSection = field(default_factory=GeneralSection)
    admin: AdminSection = field(default_factory=AdminSection)
    auth: AuthSection = field(default_factory=AuthSection)
    client: ClientSection = field(default_factory=ClientSection)
    upstream: UpstreamSection = field(default_factory=UpstreamSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    egress: EgressSection = field(default_factory=EgressSection)
    pacing: PacingSection = field(default_factory=PacingSection)
    clients: ClientsSection = field(default_factory=ClientsSection)
    robots: RobotsSection = field(default_factory=RobotsSection)
    exempt: ExemptSection = field(default_factory=ExemptSection)
    hosts: Mapping[str, HostSection] | None = None
    pipelines: Mapping[str, PipelineSection] = field(default_factory=lambda: MappingProxyType({}))
    cache: CacheSection = field(default_factory=CacheSection)

    def value(self, key: str) -> Any:
        """The value of a dotted key of a section ("pacing.max_wait", "listen")."""
        head, _, name = key.rpartition(".")
        return getattr(getattr(self, head or "general"), name)


def _attr(table: str) -> str:
    """The ``Sections`` field of a table name: "" is general, "hosts.*" is hosts."""
    return table.removesuffix(".*") or "general"


def _one(cls: type[_T], tree: Mapping[str, Any]) -> _T:
    return cls(**{f.name: freeze(tree[f.name]) for f in fields(cls)})  # type: ignore[arg-type]


def sections_from(tree: Mapping[str, Any]) -> Sections:
    """The typed sections of a validated config tree (config/loading.py's, every key present)."""
    made: dict[str, Any] = {}
    for cls, table in SECTION_CLASSES.items():
        if table.endswith(".*"):
            named = tree[_attr(table)]
            made[_attr(table)] = (
                None if named is None else MappingProxyType({n: _one(cls, t) for n, t in named.items()})
            )
        else:
            made[_attr(table)] = _one(cls, tree[table] if table else tree)
    return Sections(**made)


# What a config without a [hosts] table gets (not a key's default): index.commoncrawl.org is one fragile pywb
# server, which cdx_toolkit paces at 1 s.
DEFAULT_HOST_INTERVALS: tuple[tuple[str, float], ...] = (("index.commoncrawl.org", 1.0),)

_KEY = "politeproxy.table.key"  # the field metadata that names a field's key


def from_table(key: str, convert: Callable[[Any], Any] = freeze) -> Any:
    """A field of a part's own settings dataclass (``PacingSettings``, ``BackoffPolicy``, ...) that holds the
    table key ``key``: its default is the table's (``convert``ed), and ``table_values`` fills it from the
    sections, so its default and its source are written nowhere else."""
    return field(default=convert(freeze(default(key))), metadata={_KEY: (key, convert)})


def table_values(cls: type[Any], sections: Sections) -> dict[str, Any]:
    """The ``from_table`` fields of dataclass ``cls``, by name, with their values in ``sections``."""
    out: dict[str, Any] = {}
    for f in fields(cls):
        if _KEY in f.metadata:
            key, convert = f.metadata[_KEY]
            out[f.name] = convert(sections.value(key))
    return out


def setting(key: str) -> Setting:
    """The entry of ``key``; ``hosts.<pattern>.interval`` style keys find their ``*`` entry."""
    if key in BY_KEY:
        return BY_KEY[key]
    head, _, rest = key.partition(".")
    return BY_KEY[f"{head}.*.{rest.rsplit('.', 1)[-1]}"]


def default(key: str) -> Any:
    return setting(key).default


def restart_only() -> tuple[str, ...]:
    """The keys only a restart applies, in table order."""
    return tuple(s.key for s in SETTINGS if not s.reload)
