"""Profile politeproxy's hot path under small-GET load with py-spy, and print where the time goes.

``.venv/bin/python bench/profile_small_gets.py [--mode off|exempt|bulk] [--concurrency 16] [--duration 10]``
needs ``py-spy`` (``.venv/bin/pip install py-spy``) and ptrace rights. It records collapsed stacks while
``hey`` drives the proxy, then prints two tables: the functions with the most inclusive samples (project
and library frames, grouped by file:function) and the most self samples (where the CPU actually is).
The raw collapsed stacks stay in ``--out`` for flame graphs. The cache and the exempt ceiling are off
(``PACING_OFF``), so what is measured is the proxy itself.

``--cprofile N [TREE ...]`` instead runs each tree's proxy under cProfile (deterministic), sends N small GETs
with ``hey -c CONCURRENCY``, and prints Python calls per request and the functions called most per request.
Startup is subtracted: calls counted after an idle run of the same tree (no requests) are taken off.
"""

from __future__ import annotations

import argparse
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    DATA_HOST,
    PACING_OFF,
    PY,
    Bench,
    free_port,
    log,
    make_certs,
    politeproxy_config,
    start_politeproxy,
    start_upstream,
    table,
    understood_by,
    wait_for,
)


def frame_key(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/file.py:123)"
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    path = where.rsplit(":", 1)[0]
    for marker in ("site-packages/", "lib/python3.11/", "politeproxy/"):
        if marker in path:
            path = ("politeproxy/" if marker == "politeproxy/" else "") + path.split(marker, 1)[1]
            break
    return f"{path}:{name}"


WRITES = ("Served.write", "StreamWriter._write", "StreamWriter._writelines")  # native TLS + send shows here
# Areas of the proxy, each a test on a sample's frames (a sample may fall in several).
AREAS: tuple[tuple[str, Callable[[list[str]], bool]], ...] = (
    (
        "response writes to the client (Served.write, aiohttp StreamWriter._write: TLS + send)",
        lambda ks: any(k.endswith(WRITES) for k in ks),
    ),
    ("TLS decrypt (ssl.py SSLObject.read)", lambda ks: any(k.endswith("SSLObject.read") for k in ks)),
    (
        "upstream client (Upstream.request: aiohttp; h1client/h1conn: the lean one for GETs)",
        lambda ks: any(
            k.endswith("Upstream.request")
            or k.startswith(("politeproxy/proxy/origin/h1client", "politeproxy/proxy/origin/h1conn"))
            for k in ks
        ),
    ),
    (
        "pacer and store (politeproxy/pacing/, stores/)",
        lambda ks: any(k.startswith(("politeproxy/pacing/", "politeproxy/stores/")) for k in ks),
    ),
    ("access log (logging)", lambda ks: any(k.startswith("logging/") for k in ks)),
    (
        "metrics (observe/metrics.py, observe/inplace.py, prometheus_client)",
        lambda ks: any(
            k.startswith(("prometheus_client/", "politeproxy/observe/metrics", "politeproxy/observe/inplace"))
            for k in ks
        ),
    ),
    (
        "event loop, native code (self time in Runner.run)",
        lambda ks: bool(ks) and ks[-1].endswith("Runner.run"),
    ),
)


def summarize(raw: Path, top: int) -> str:
    inclusive: Counter[str] = Counter()
    self_: Counter[str] = Counter()
    areas: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n_s = line.rpartition(" ")
        if not n_s.isdigit():
            continue
        n = int(n_s)
        total += n
        frames = [frame_key(f) for f in stack.split(";") if f]
        for k in set(frames):
            inclusive[k] += n
        if frames:
            self_[frames[-1]] += n
        for name, test in AREAS:
            if test(frames):
                areas[name] += n
    if not total:
        return "no samples (does py-spy have ptrace rights?)"

    def rows(c: Counter[str]) -> list[list[str]]:
        return [[f"{100 * n / total:.1f}%", f"`{k}`"] for k, n in c.most_common(top)]

    by_area = [[f"{100 * areas[name] / total:.1f}%", name] for name, _ in AREAS]
    return (
        f"{total} samples\n\n**By area**\n\n"
        + table(["share", "area"], by_area)
        + f"\n\n**Self time (top {top})**\n\n"
        + table(["share", "function"], rows(self_))
        + f"\n\n**Inclusive time (top {top})**\n\n"
        + table(["share", "function"], rows(inclusive))
    )


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--mode",
        choices=("off", "exempt", "bulk"),
        default="off",
        help="off: small GETs, pacing off; exempt: Range reads; bulk: one large download with curl",
    )
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "politeproxy-profile.txt"))
    p.add_argument("--cprofile", type=int, default=0, metavar="N", help="cProfile N small GETs (mode off)")
    p.add_argument("trees", nargs="*", type=Path, help="source trees for --cprofile (default: this one)")
    return p.parse_args(argv)


def _profiled_run(b: Bench, up: object, tree: Path, n: int, c: int) -> pstats.Stats:
    """One proxy of ``tree`` under cProfile, ``n`` small GETs at concurrency ``c``, stopped with SIGTERM."""
    tag = f"{tree.name}-{n}-{time.monotonic_ns()}"
    cfg = b.tmp / f"{tag}.toml"
    cfg.write_text(politeproxy_config(up, understood_by(tree, PACING_OFF)))  # type: ignore[arg-type]
    port, out = free_port(), b.tmp / f"{tag}.pstats"
    cmd = [PY, "-m", "cProfile", "-o", str(out), "-m", "politeproxy", "run", "--config", str(cfg)]
    cmd += ["--data-dir", str(b.tmp / f"d-{tag}"), "--listen", f"127.0.0.1:{port}"]
    with open(b.tmp / f"{tag}.log", "wb") as logf:
        proc = subprocess.Popen(cmd, cwd=tree, stdout=logf, stderr=subprocess.STDOUT)

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return True
        except OSError:
            return False

    try:
        wait_for(lambda: proc.poll() is not None or healthy(), 60, "politeproxy /healthz")
    finally:
        if proc.poll() is not None:
            raise RuntimeError(f"politeproxy exited: {(b.tmp / f'{tag}.log').read_text()[-2000:]}")
    if n:
        url = f"https://{DATA_HOST}/size/1024"
        subprocess.run(
            ["hey", "-n", str(n), "-c", str(c), "-x", f"http://127.0.0.1:{port}", url], capture_output=True
        )
    proc.send_signal(signal.SIGTERM)
    proc.wait(60)
    return pstats.Stats(str(out))


def cprofile_main(a: argparse.Namespace) -> str:
    trees = a.trees or [Path(__file__).resolve().parent.parent]
    lines = [f"### cProfile, {a.cprofile} small GETs at c={a.concurrency} (startup subtracted)", ""]
    with Bench() as b:
        up = start_upstream(b, make_certs(b.tmp))
        for tree in trees:
            idle, st = (
                _profiled_run(b, up, tree, 0, a.concurrency),
                _profiled_run(b, up, tree, a.cprofile, a.concurrency),
            )
            per = (st.total_calls - idle.total_calls) / a.cprofile  # type: ignore[attr-defined]
            lines.append(f"**{tree}**: {per:.0f} Python calls per request")
            base = {k: v[1] for k, v in idle.stats.items()}  # type: ignore[attr-defined]
            rows = sorted(
                ((v[1] - base.get(k, 0)) / a.cprofile, f"{Path(k[0]).name}:{k[1]}:{k[2]}")
                for k, v in st.stats.items()  # type: ignore[attr-defined]
            )[::-1][: a.top]
            lines += ["", table(["calls/req", "function"], [[f"{r:.2f}", f"`{f}`"] for r, f in rows]), ""]
    text = "\n".join(lines)
    print(text)
    return text


def main(argv: list[str] | None = None) -> str:
    a = _args(argv)
    if a.cprofile:
        return cprofile_main(a)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        raise SystemExit("py-spy not found: .venv/bin/pip install py-spy")
    with Bench() as b:
        certs = make_certs(b.tmp)
        files = b.tmp / "files"
        files.mkdir()
        (files / "small.bin").write_bytes(b"y" * 1024)
        up = start_upstream(b, certs, files)
        pp = start_politeproxy(b, up, PACING_OFF)
        path, headers = {
            "off": ("/size/1024", []),
            "exempt": ("/cc-index/table/small.bin", ["-H", "Range: bytes=0-1023"]),
            "bulk": (f"/size/{1 << 40}", []),  # more than can arrive in --duration: curl stops at the limit
        }[a.mode]
        url = f"https://{DATA_HOST}{path}"
        hey = ["hey", "-c", str(a.concurrency), "-x", pp.url, *headers]
        if a.mode == "bulk":
            load_cmd = ["curl", "-sS", "-o", "/dev/null", "-x", pp.url, "--cacert", str(pp.ca_file)]
            load_cmd += [
                "--max-time",
                str(a.duration),
                "-w",
                "Requests/sec: - speed %{speed_download} B/s",
                url,
            ]
        else:
            subprocess.run([*hey, "-z", "1s", url], capture_output=True, check=True)  # warm-up
            load_cmd = [*hey, "-z", f"{a.duration}s", url]
        out = Path(a.out)
        rec = subprocess.Popen(
            [spy, "record", "--pid", str(pp.pid), "--rate", str(a.rate), "--format", "raw", "--nonblocking"]
            + ["--duration", str(int(a.duration)), "--output", str(out)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(0.5)
        load = subprocess.run(load_cmd, capture_output=True, text=True)
        _, err = rec.communicate(timeout=a.duration + 60)
        if rec.returncode != 0:
            raise SystemExit(f"py-spy failed: {err.decode(errors='replace')[-1000:]}")
        rps = next((ln.strip() for ln in load.stdout.splitlines() if "Requests/sec" in ln), "?")
        rps = rps.replace("\t", " ")
        log(f"profiled {a.mode} at c={a.concurrency}: {rps}; raw stacks in {out}")
        text = f"### py-spy profile, mode {a.mode}, c={a.concurrency} ({rps})\n\n" + summarize(out, a.top)
    print(text)
    return text


if __name__ == "__main__":
    main()
