# ruff: noqa: E501 - one line per setting, so that adding one is one line
"""THE table of settings: one line per config key (policy core, pure data, no I/O).

Everything else is derived from it: the TOML schema and its checks (config/loading.py), the environment
and flag overrides (config/overrides.py, commands/cli.py), the restart-only list (app.py), the named
defaults (policy/settings.py) and the reference in docs/configuration.md (config/reference.py).

Adding a setting is one ``Setting(...)`` line here plus the code that uses it. ``kind`` names a converter
(policy/values.py ``CONVERTERS``; the four kinds of nested tables are config/loading.py's). A key with a
``*`` is one entry of a table keyed by a name (``hosts.<pattern>.interval``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from politeproxy.policy.hosts import DEFAULT_PACED_HOSTS

DAY = 86400.0
MIN, HOUR = 60.0, 3600.0
SIZE_BOUNDS = (0, 1 << 50)  # bytes; a petabyte is already a typo


@dataclass(frozen=True, slots=True)
class Setting:
    """One config key: how it is read, its default and bounds, and whether a reload applies it."""

    key: str  # dotted: "schedule.global_rate"; "hosts.*.interval" for a table keyed by name
    kind: str  # a converter's name: "duration", "rate", "int", "bool", "cidr list", ...
    default: Any  # the validated value a missing key gets (tuples stand for lists)
    doc: str  # one line for the reference
    bounds: tuple[float, float] | None = None  # inclusive, in ``unit``
    unit: str = ""  # "s" for durations and rates, "bytes" for sizes
    reload: bool = False  # True: a reload applies it; False: only a restart does
    env: str = ""  # POLITEPROXY_* variable that overrides the file
    flag: str = ""  # command-line flag that overrides the file and the variable
    flag_all: bool = False  # the flag is on every command that reads the config, not only run and env
    choices: tuple[str, ...] = ()  # for kind "choice"

    @property
    def override(self) -> str:
        """The override's name in ``overrides`` mappings: the variable's or the flag's (``global_rate``)."""
        if self.env:
            return self.env.removeprefix("POLITEPROXY_").lower()
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.key.split("."))


S = Setting
_D = "s"  # the unit of every duration and rate
# fmt: off
SETTINGS: tuple[Setting, ...] = (
    S("listen", "host:port", "127.0.0.1:3128", "where clients connect; a non-loopback address needs allow_clients or [auth] users", env="POLITEPROXY_LISTEN", flag="--listen", flag_all=True),
    S("data_dir", "path", "", "CA, schedule and cache; empty: $XDG_DATA_HOME/politeproxy, else ~/.local/share/politeproxy", env="POLITEPROXY_DATA_DIR", flag="--data-dir", flag_all=True),
    S("allow_clients", "cidr list", (), "CIDRs allowed besides loopback; others get 403"),
    S("metrics_listen", "host:port or empty", "", "also serve /metrics and /healthz on this address", flag="--metrics-listen"),
    S("workers", "count or auto", 1, "processes serving the one port (SO_REUSEPORT) on one data dir and store; auto: one per core; needs the file or redis store", bounds=(1, 256), flag="--workers"),
    S("log_format", "choice", "plain", "log lines: plain, or one JSON object per line", flag="--log-format", choices=("plain", "json")),
    S("paced_hosts", "host patterns", DEFAULT_PACED_HOSTS, "host patterns intercepted and paced (*.x: any subdomain of x)"),
    S("tunnel_ports", "ports", (443,), "ports a CONNECT may reach; others get 403", bounds=(1, 65535)),
    S("allow_private_destinations", "bool", False, "let non-loopback clients reach loopback, link-local and this host's addresses"),
    S("allow_ip_connect", "bool", False, "tunnel a CONNECT (or send a plain http:// request) to an IP literal when no paced name resolves to the address; off: refused, no name to pace or sign for"),
    S("admin_hosts", "names", ("politeproxy", "politeproxy.politeproxy.svc", "politeproxy.politeproxy.svc.cluster.local"), "Host names the admin paths answer besides IP addresses, localhost, this machine's name and the listen address (a DNS-rebinding guard)"),
    S("intercept_s3_path_style", "bool", False, "also intercept s3[.<region>].amazonaws.com and pace only /commoncrawl/ there"),
    S("admin.token_env", "string", "", "the environment variable that holds a token POST /release must carry (Authorization: Bearer TOKEN; politeproxy release sends it from the same variable); empty: no token. Recommended where others share the machine or the allowed networks"),
    S("admin.token_file", "string", "", "a file whose first line is that token, instead of token_env (~ expanded)"),
    S("auth.users", "users", {}, '{ name = "password" }: require Proxy-Authorization: Basic (else 407)', env="POLITEPROXY_AUTH_USERS"),
    S("client.handshake_timeout", "duration", 10.0, "TLS handshake with a client", bounds=(0.0, HOUR), unit=_D),
    S("client.header_timeout", "duration", 15.0, "the first request head on a connection", bounds=(0.0, HOUR), unit=_D),
    S("client.idle_timeout", "duration", 60.0, "idle keep-alive connections and blind tunnels are closed after it", bounds=(0.0, DAY), unit=_D),
    S("client.max_header_size", "int", 32768, "bytes per request head; a larger one gets 431", bounds=(1024, 1 << 20), unit="bytes"),
    S("client.max_connections", "int", 4096, "client connections open at once, tunnels included; one more gets 503", bounds=(1, 1_000_000)),
    S("upstream.ca_file", "path", "", "extra trust anchors for upstream TLS (a PEM file, added to the usual ones); resolved like data_dir", env="POLITEPROXY_UPSTREAM_CA", flag="--upstream-ca"),
    S("upstream.resolve", "resolve table", {}, '{ "host:port" = "ip:port" }, like curl --resolve'),
    S("upstream.connect_timeout", "duration", 10.0, "504 when exceeded, 502 when refused", bounds=(0.0, 600.0), unit=_D),
    S("upstream.read_timeout", "duration", 60.0, "between reads from upstream", bounds=(0.0, DAY), unit=_D),
    S("upstream.max_connections", "int", 256, "upstream connections in use at once, shared out per class", bounds=(1, 100_000)),
    S("schedule.backend", "choice", "file", "where the shared schedule lives", choices=("memory", "file", "redis")),
    S("schedule.global_rate", "rate", 0.2, 'the gap between paced grants across all paced requests ("200ms"), or a rate ("5/s", "300/m"); 0 = off', bounds=(0.0, HOUR), unit=_D, reload=True, env="POLITEPROXY_GLOBAL_RATE", flag="--global-rate"),
    S("schedule.redis_url", "redis url", "redis://127.0.0.1:6379/0", "redis://, rediss:// or unix://; the password is never logged", env="POLITEPROXY_REDIS_URL"),
    S("schedule.redis_prefix", "string", "politeproxy:", "key prefix: one budget per prefix"),
    S("schedule.redis_key_ttl", "duration", DAY, "how long idle keys live", bounds=(MIN, 30 * DAY), unit=_D),
    S("egress.name", "egress name", "", "the name Common Crawl counts requests under (one IP): proxies sharing a store and this name share one request window; give every machine behind one NAT the same name; empty: this machine's host name", env="POLITEPROXY_EGRESS_NAME"),
    S("egress.window", "duration", 300.0, "the trailing window requests are counted in (Common Crawl's WAF blocks an IP above 6,000 requests in 300 s)", bounds=(1.0, DAY), unit=_D, reload=True),
    S("egress.limit", "int", 4800, "requests per window per service, every class together (80% of Common Crawl's 6,000); 0 turns the window off, with a warning at start", bounds=(0, 10_000_000), reload=True),
    S("schedule.expected_proxies", "int", 1, "floor of the gap multiplier while the shared store is down (else the live proxies last seen)", bounds=(1, 1000)),
    S("pacing.max_wait", "duration", 25.0, "longest a request is held; beyond it 503 + Retry-After", bounds=(0.0, HOUR), unit=_D, reload=True),
    S("clients.rules", "client rules", None, '[[clients.rules]] user_agent (a prefix of the User-Agent), max_wait: the hold bound of the clients it matches, in place of pacing.max_wait; before the built-in rules (boto3, the AWS CLI, aiobotocore/s3fs: 55s; duckdb, cdx_toolkit: 25s; the AWS SDK for Java)', reload=True),
    S("clients.keep_defaults", "bool", True, "keep the built-in client rules after [[clients.rules]]; false: only the listed rules", reload=True),
    S("pacing.retries", "int", 2, "transparent retries of a throttled GET/HEAD", bounds=(0, 10), reload=True),
    S("pacing.max_queue", "int", 1024, "requests one proxy holds waiting at most (paced and exempt)", bounds=(1, 1_000_000), reload=True),
    S("pacing.throttle_codes", "status codes", (429, 500, 503), 'answers that mean "slow down" (backoff, retry)', reload=True),
    S("pacing.backoff_base", "duration", 1.0, "first backoff without Retry-After", bounds=(0.0, HOUR), unit=_D, reload=True),
    S("pacing.backoff_cap", "duration", 300.0, "the longest backoff, Retry-After included", bounds=(0.0, DAY), unit=_D, reload=True),
    S("pacing.backoff_jitter", "float", 0.2, "a backoff grows by up to this fraction", bounds=(0.0, 1.0), reload=True),
    S("pacing.index_rest", "duration", 60.0, "after a 502, 503, 504, reset or empty reply from the index server, no request goes to it for this long (or Retry-After, or the backoff, if longer), doubled per warning in a row; 0: off", bounds=(0.0, DAY), unit=_D, reload=True),
    S("pacing.block_codes", "status codes", (403,), "answers that block the host (hold, then one probe)", reload=True),
    S("pacing.block_hold", "duration", 120.0, "the first hold after a block, doubled per consecutive block", bounds=(0.0, DAY), unit=_D, reload=True),
    S("pacing.block_hold_cap", "duration", 1800.0, "the longest hold (at least block_hold)", bounds=(0.0, DAY), unit=_D, reload=True),
    S("pacing.adaptive", "bool", True, "raise a host's interval on throttles and blocks (AIMD)", reload=True),
    S("pacing.adaptive_floor", "rate", 1.0, "the raised interval is at least this", bounds=(0.0, HOUR), unit=_D, reload=True),
    S("pacing.adaptive_recovery", "duration", 60.0, "back to the configured interval in 4 steps over this", bounds=(0.0, DAY), unit=_D, reload=True),
    S("robots.enabled", "bool", True, "fetch robots.txt per paced host and honour Crawl-delay", reload=True),
    S("robots.ttl", "duration", HOUR, "how long a robots.txt answer is trusted", bounds=(0.0, 30 * DAY), unit=_D, reload=True),
    S("robots.max_crawl_delay", "duration", 10.0, "the most a Crawl-delay can raise a host's interval", bounds=(0.0, HOUR), unit=_D, reload=True),
    S("exempt.max_in_flight", "int", 16, "exempt requests in flight per service (every name of the bucket together), per proxy", bounds=(1, 10_000), reload=True),
    S("exempt.respect_backoff", "bool", True, "exempt requests wait out a host's active backoff", reload=True),
    S("exempt.rate", "rate", 0.1, "GCRA ceiling of exempt reads per service (every name of the bucket together), shared through the store; 0 = none", bounds=(0.0, 60.0), unit=_D, reload=True),
    S("exempt.burst", "int", 90, "exempt reads that may go at once before the rate applies", bounds=(1, 100_000), reload=True),
    S("exempt.rules", "exempt rules", None, "[[exempt.rules]] host, path, range_required, methods; added to the defaults (range reads and HEAD under /cc-index/table/ and /projects/host-index* on data.commoncrawl.org and the bucket's names)", reload=True),
    S("exempt.keep_defaults", "bool", True, "keep the default exempt rules beside [[exempt.rules]]; false: the listed rules replace them", reload=True),
    S("hosts.*.interval", "rate", 0.0, "least interval between grants to a host; any [hosts] table replaces the default (index.commoncrawl.org 1s)", bounds=(0.0, HOUR), unit=_D, reload=True),
    S("pipelines.*.weight", "float", 1.0, "a pipeline's share relative to others", bounds=(0.01, 1000.0), reload=True),
    S("pipelines.*.token_env", "string", "", "the environment variable that holds this pipeline's secret (never the secret itself): a client naming the pipeline must send it as the proxy password (http://NAME:SECRET@host:port), or counts as the guest pipeline NAME~guest"),
    S("pipelines.*.token_file", "string", "", "a file whose first line is the secret, instead of token_env (~ expanded)"),
    S("pipelines.*.max_queued", "int", 0, "requests of this pipeline waiting at once; 0 = no cap", bounds=(0, 1_000_000), reload=True),
    S("cache.enabled", "bool", True, "the shared disk cache of immutable objects"),
    S("cache.max_object", "size", 64 << 20, "largest 200 body kept", bounds=SIZE_BOUNDS, unit="bytes"),
    S("cache.max_range", "size", 16 << 20, "largest 206 body kept", bounds=SIZE_BOUNDS, unit="bytes"),
    S("cache.max_size", "size", 2 << 30, "total on disk; least recently used entries are evicted beyond it", bounds=SIZE_BOUNDS, unit="bytes"),
    S("cache.collinfo_ttl", "duration", DAY, "how long collinfo.json is served before it is fetched again", bounds=(0.0, 30 * DAY), unit=_D),
    S("cache.index_answers", "bool", True, "keep the index server's CDX API answers for crawls collinfo.json lists (immutable once published), under the exact query; false: every index query goes upstream"),
    S("cache.index_miss_ttl", "duration", DAY, "how long pywb's \"No Captures found\" 404 for a published crawl is kept; 0: never", bounds=(0.0, 30 * DAY), unit=_D),
    S("cache.index_redis_max_answer", "size", 8 << 20, "on the redis store, kept index answers also live in Redis (shared by proxies with data dirs of their own): the largest kept there", bounds=SIZE_BOUNDS, unit="bytes"),
    S("cache.index_redis_max_size", "size", 256 << 20, "on the redis store, the total of kept index answers in Redis; the oldest go first beyond it", bounds=SIZE_BOUNDS, unit="bytes"),
    S("cache.rules", "cache rules", None, "[[cache.rules]] class, hosts, paths, exact, ttl, ranges; replaces the default table"),
)
# fmt: on

BY_KEY: dict[str, Setting] = {s.key: s for s in SETTINGS}


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
