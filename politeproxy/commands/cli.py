"""The command line: run, env, exec, ca, status, cache, doctor, simulate, release, config, check-config."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path
from typing import Any

from politeproxy import __version__
from politeproxy.config.loading import Config, ConfigError, check_environment, env_overrides, load
from politeproxy.observe.logs import error_line, setup_logging
from politeproxy.policy.fairness import clean_name
from politeproxy.policy.table import SETTINGS, Setting
from politeproxy.stores.base import Backend

EXIT_CONFIG = 2
DOCTOR_URL = "https://index.commoncrawl.org/collinfo.json"  # politeproxy doctor's one paced request


def _config_path(args: argparse.Namespace) -> str | None:
    """--config, else POLITEPROXY_CONFIG, else the default place when a file is there (issue 26)."""
    given = getattr(args, "config", None) or os.environ.get("POLITEPROXY_CONFIG")
    if given:
        return str(given)
    path = _default_config()
    return path if Path(path).is_file() else None


def _default_config() -> str:
    """The default place, watched by `run` even while no file is there: one written later is read."""
    from politeproxy.config.template import default_path

    return str(default_path())


def cmd_config(args: argparse.Namespace) -> int:
    """``config path``: where the config is read from; ``config init``: write a commented one there."""
    from politeproxy.config.template import default_path, render

    given = getattr(args, "config", None) or os.environ.get("POLITEPROXY_CONFIG")
    path = Path(given) if given else default_path()
    if args.action == "path":
        how = "--config or POLITEPROXY_CONFIG" if given else "the default place"
        state = "present" if path.is_file() else "absent: the built-in defaults apply"
        print(f"{path} ({how}; {state})")
        return 0
    if path.exists() and not args.force:
        return _fail(f"{path} exists; politeproxy config init --force replaces it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render(), encoding="utf-8")
    except OSError as e:
        return _fail(f"cannot write {path}: {e.strerror or e}", 1)
    print(f"wrote {path}: every key at its default, commented out (politeproxy run reads it from there)")
    return 0


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Environment, then flags: both win over the config file, and a reload applies them again."""
    out = env_overrides()
    for s in SETTINGS:
        value = getattr(args, s.override, None) if s.flag else None
        if value is not None:
            out[s.override] = value
    return out


def _config(args: argparse.Namespace) -> Config:
    return load(_config_path(args), _overrides(args))


def _fail(msg: str, code: int = EXIT_CONFIG, fmt: str = "plain") -> int:
    print(error_line(msg, fmt), file=sys.stderr)  # a JSON line when run logs JSON
    return code


def cmd_run(args: argparse.Namespace) -> int:
    fmt = args.log_format or "plain"  # the config's own once it is read: JSON mode is JSON from line one
    try:
        cfg = _config(args)
        fmt = cfg.sections.general.log_format
        check_environment(os.environ)  # POLITEPROXY_CLOCK_OFFSET, POLITEPROXY_RATE_WINDOW
    except ConfigError as e:
        return _fail(str(e), fmt=fmt)
    setup_logging(args.verbose, cfg.sections.general.log_format)
    workers = _workers(args, cfg)
    if workers is not None:
        return workers
    from politeproxy.app import App
    from politeproxy.config.storebuild import StartupError

    async def main() -> int:
        loop_kind = type(asyncio.get_running_loop()).__module__.split(".")[0]
        logging.getLogger("politeproxy").info("event loop: %s", loop_kind)
        app = App(cfg, _config_path(args) or _default_config(), _overrides(args))
        try:
            await app.start()
        except StartupError as e:
            return _fail(str(e), fmt=fmt)
        await app.serve_forever()
        return 0

    # uvloop where available; POLITEPROXY_EVENT_LOOP=asyncio runs on the standard loop (tests, debugging).
    uvloop: Any = None
    if os.environ.get("POLITEPROXY_EVENT_LOOP", "").lower() != "asyncio":
        try:
            import uvloop
        except ImportError:
            uvloop = None
    # The import is kept apart from the run: an ImportError inside main() must not start it twice.
    return int(uvloop.run(main()) if uvloop is not None else asyncio.run(main()))


def _workers(args: argparse.Namespace, cfg: Config) -> int | None:
    """``--workers N`` above 1: the supervisor runs N workers and this returns its exit code; None: run here.

    The memory store is refused rather than swapped for the data dir's: it is one process's, and choosing
    another store for the operator would move the budget somewhere the config does not say."""
    from politeproxy.commands.supervisor import Supervisor, worker_count

    n = worker_count(cfg.sections.general.workers)
    if n <= 1:
        return None
    if not Backend(cfg.sections.schedule.backend).shared:
        return _fail(
            f"workers = {n} needs a store the workers share: the memory store is one process's; "
            'set [schedule] backend = "file" (the data dir, the default) or "redis"',
            fmt=cfg.sections.general.log_format,
        )
    from politeproxy.config.startup import open_data_dir
    from politeproxy.config.storebuild import StartupError
    from politeproxy.policy.hosts import HostSet

    try:  # the CA once, here: workers starting together would each make one
        open_data_dir(cfg.data_dir, HostSet(cfg.paced_hosts))
    except StartupError as e:
        return _fail(str(e), fmt=cfg.sections.general.log_format)
    return Supervisor(list(getattr(args, "argv", None) or sys.argv[1:]), n, *cfg.listen).run()


def _ca(cfg: Config) -> Any:
    from politeproxy.policy.hosts import HostSet
    from politeproxy.proxy.door.ca import CAError, CertificateAuthority

    try:
        ca = CertificateAuthority(cfg.data_dir, HostSet(cfg.paced_hosts).permitted_subtrees(), remake=False)
    except (CAError, ValueError) as e:  # a corrupt CA file: one line, not a traceback
        raise ConfigError(" ".join(f"the CA in {cfg.data_dir}: {e}".split())[:300]) from None
    if ca.missing:
        print(
            f"politeproxy: warning: the CA in {cfg.data_dir} does not permit {_names(ca.missing)}; "
            "`politeproxy run` with this config will make a new one (then run `politeproxy env` again)",
            file=sys.stderr,
        )
    return ca


def _names(names: list[str], shown: int = 4) -> str:
    """A list of host names for one line: the S3 endpoint forms make it run to hundreds."""
    if len(names) <= shown:
        return ", ".join(names)
    more = len(names) - shown
    return f"{', '.join(names[:shown])} and {more} more ({len(names)} names; `politeproxy ca --all`)"


def _config_and_ca(args: argparse.Namespace) -> tuple[Config, Any] | int:
    """The config and the CA for ``env`` and ``ca``, or the exit code of a failure already reported."""
    try:
        cfg = _config(args)
        return cfg, _ca(cfg)
    except ConfigError as e:
        return _fail(str(e))
    except OSError as e:
        return _fail(f"data_dir {e.filename}: {e.strerror}", 1)


def _env_lines(args: argparse.Namespace) -> tuple[Config, list[str]] | int:
    """The lines `env` prints (and `exec` sets), or the exit code of a failure already reported."""
    from politeproxy.commands.envlines import env_output

    got = _config_and_ca(args)
    if isinstance(got, int):
        return got
    cfg, ca = got
    name = args.pipeline
    if name is not None and (not name or ":" in name or clean_name(name) != name):
        return _fail(f"--pipeline {name!r}: 1-64 printable characters, no spaces, quotes or ':'")
    return cfg, env_output(cfg, ca, name)


def cmd_env(args: argparse.Namespace) -> int:
    got = _env_lines(args)
    if isinstance(got, int):
        return got
    lines = got[1]
    if args.pipeline and (token := next((ln for ln in lines if "needs its token" in ln), None)):
        print(f"politeproxy env: {token.lstrip('# ')}", file=sys.stderr)  # the shell's user sees it too
    print("\n".join(lines))
    return 0


def cmd_exec(args: argparse.Namespace) -> int:
    """COMMAND in a network namespace whose only way out is the proxy (commands/exec_cmd.py)."""
    from politeproxy.commands.envlines import proxy_netloc
    from politeproxy.commands.exec_cmd import run

    got = _env_lines(args)
    if isinstance(got, int):
        return got
    command = args.exec_argv[1:] if args.exec_argv[:1] == ["--"] else args.exec_argv
    return run(proxy_netloc(got[0]), got[1], command)


def cmd_ca(args: argparse.Namespace) -> int:
    got = _config_and_ca(args)
    if isinstance(got, int):
        return got
    _cfg, ca = got
    print(f"ca.pem        {ca.cert_path}")
    print(f"ca-key.pem    {ca.key_path}")
    print(f"ca-bundle.pem {ca.bundle_path}")
    print(f"permits       {', '.join(ca.permitted) if args.all else _names(ca.permitted)}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from politeproxy.commands import doctor

    return doctor.main(args)


def cmd_check_config(args: argparse.Namespace) -> int:
    try:
        cfg = load(args.file, env_overrides())  # the POLITEPROXY_* variables `run` would apply too
    except ConfigError as e:
        return _fail(str(e))
    print(f"{args.file}: ok (listen {cfg.listen[0]}:{cfg.listen[1]}, store {cfg.sections.schedule.backend})")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from politeproxy.observe import statusview

    url = args.admin
    if url is None:  # the proxy this config (or --listen) describes
        try:
            url = statusview.admin_url(*_config(args).listen)
        except ConfigError as e:
            return _fail(str(e))
    return statusview.run(
        url, watch=args.watch, interval=args.interval, as_json=args.json, all_proxies=args.all
    )


def cmd_simulate(args: argparse.Namespace) -> int:
    """A workload through the config's pacing policy on a virtual clock (issue 24 item 6)."""
    from politeproxy.commands import simjob, simulate

    try:
        cfg = _config(args)
    except ConfigError as e:
        return _fail(str(e))
    return simjob.main(args, cfg) if args.job else simulate.main(args, cfg)


def cmd_release(args: argparse.Namespace) -> int:
    """Lift a host's hold or backoff through the admin endpoint (issue 24 item 5)."""
    from politeproxy.commands import release
    from politeproxy.observe import statusview

    try:
        cfg = _config(args)
        url = args.admin or statusview.admin_url(*cfg.listen)
        token = cfg.admin_token()  # [admin] token_env / token_file, read from this shell (issue 42)
    except ConfigError as e:
        return _fail(str(e))
    return release.main(url, args.host, token)


def cmd_cache(args: argparse.Namespace) -> int:
    """The shared disk cache in <data_dir>/cache (issue 14): stats, or clear it (--index: only the index
    server's kept answers, issue 43)."""
    from politeproxy.cache import report
    from politeproxy.cache.base import CacheError

    try:
        cfg = _config(args)
        print(report.run(args.action, cfg.data_dir / "cache", cfg.cache(), args.index))
        sched = cfg.sections.schedule
        if Backend(sched.backend) is Backend.REDIS and (args.index or args.action == "stats"):
            print(report.redis_part(args.action, sched.redis_url, sched.redis_prefix))
    except ConfigError as e:
        return _fail(str(e))
    except (CacheError, OSError) as e:
        return _fail(f"the cache in {cfg.data_dir}: {e}", 1)
    return 0


def _flag(sp: argparse.ArgumentParser, s: Setting, hidden: bool) -> None:
    """The flag of a table entry (policy/table.py): its doc, its variable and its key as the help."""
    env = f"env {s.env}; " if s.env else ""
    text = argparse.SUPPRESS if hidden else f"{s.doc} ({env}config {s.key})"
    sp.add_argument(s.flag, dest=s.override, choices=s.choices or None, help=text)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="politeproxy", description="One request budget for Common Crawl.")
    p.add_argument("--version", action="version", version=f"politeproxy {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", help="TOML config file (env POLITEPROXY_CONFIG)")
        for s in SETTINGS:
            if s.flag and s.flag_all:
                _flag(sp, s, hidden=False)

    def run_flags(sp: argparse.ArgumentParser, hidden: bool = False) -> None:
        """run's own flags; ``env`` takes them too, ignored, so one ARGS serves both (make run)."""

        for s in SETTINGS:
            if s.flag and not s.flag_all:
                _flag(sp, s, hidden)
        help_ = argparse.SUPPRESS if hidden else "-v: info, -vv: debug"
        sp.add_argument("-v", "--verbose", action="count", default=0, help=help_)

    run = sub.add_parser("run", help="run the proxy")
    common(run)
    run_flags(run)
    run.set_defaults(func=cmd_run)
    env = sub.add_parser("env", help="print export lines that point tools at the proxy")
    common(env)
    run_flags(env, hidden=True)
    env.add_argument("--pipeline", help="name this pipeline in the proxy URL (its fair share, its metrics)")
    env.set_defaults(func=cmd_env)
    ex = sub.add_parser("exec", help="run COMMAND where the proxy is its only way out")
    common(ex)
    ex.add_argument("--pipeline", help="name this pipeline in the proxy URL (as env --pipeline)")
    ex.add_argument("exec_argv", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    ex.set_defaults(func=cmd_exec)
    ca = sub.add_parser("ca", help="print the paths of the CA and the bundle (made if missing)")
    common(ca)
    ca.add_argument("--all", action="store_true", help="list every name the CA permits")
    ca.set_defaults(func=cmd_ca)
    st = sub.add_parser("status", help="show queues, hosts, pipelines and rates (--watch: like top)")
    common(st)
    st.add_argument("--admin", help="the proxy's admin URL (default: http://LISTEN from the config)")
    st.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    st.add_argument("--interval", type=float, default=2.0, help="seconds between refreshes (0.5-60)")
    st.add_argument("--json", action="store_true", help="print the /status document as JSON")
    st.add_argument("--all", action="store_true", help="one row per proxy sharing the store (heartbeats)")
    st.set_defaults(func=cmd_status)
    cache = sub.add_parser("cache", help="the shared disk cache: stats, or clear it")
    cache.add_argument("action", choices=("stats", "clear"))
    cache.add_argument("--index", action="store_true", help="clear only the index server's kept answers")
    common(cache)
    cache.set_defaults(func=cmd_cache)
    doc = sub.add_parser("doctor", help="check this shell's proxy settings; send one request through it")
    doc.add_argument("--url", default=DOCTOR_URL, help=f"a paced https URL to fetch (default {DOCTOR_URL})")
    doc.set_defaults(func=cmd_doctor)
    sim = sub.add_parser("simulate", help="run a workload through this config's pacing on a virtual clock")
    common(sim)
    sim.add_argument(
        "--workload", help='rates per class, e.g. "exempt=50/s,paced=5/s" (optionally per pipeline)'
    )
    sim.add_argument("--log", help="replay this proxy access log instead of --workload")
    sim.add_argument("--job", help='counts per kind, e.g. "index=20000,warc=1000000": when the last one goes')
    sim.add_argument("--duration", default="1h", help="simulated time (default 1h)")
    sim.add_argument("--json", action="store_true", help="print the result as one JSON object")
    sim.set_defaults(func=cmd_simulate)
    rel = sub.add_parser("release", help="lift a host's hold or backoff now (every proxy on the store)")
    common(rel)
    rel.add_argument("host", help="the host (or any name of its service) to release")
    rel.add_argument("--admin", help="the proxy's admin URL (default: http://LISTEN from the config)")
    rel.set_defaults(func=cmd_release)
    conf = sub.add_parser(
        "config", help="where the config file is read from (path), or write a commented one (init)"
    )
    conf.add_argument("action", choices=("path", "init"))
    conf.add_argument("--config", help="the file (default: $XDG_CONFIG_HOME/politeproxy/politeproxy.toml)")
    conf.add_argument("--force", action="store_true", help="init: replace an existing file")
    conf.set_defaults(func=cmd_config)
    chk = sub.add_parser("check-config", help="validate a config file")
    chk.add_argument("file")
    chk.set_defaults(func=cmd_check_config)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # run --workers repeats it for every worker
    return int(args.func(args))
