"""The flake finder behind ``make test-repeat N=5``: the whole suite N times in a row, beside a CPU burner.

Each run is ``make test``'s pytest command with a JUnit XML report; the burner (one process spinning one core)
stands for the other work a user's or CI's box is doing. At the end it prints every test that ever failed,
with how many runs it failed in, and each run's time; it exits 1 if any run failed.

    python -m tests.support.repeat -n 5 [--no-burner] [-- extra pytest args]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTEST = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "4"]  # as make test
BURNER = [sys.executable, "-c", "while True: pass"]


def failed_tests(report: Path) -> list[str]:
    """The node ids of the failed or errored test cases in a JUnit XML report (a missing report: the run
    itself broke, named as such)."""
    try:
        root = ET.parse(report).getroot()
    except (OSError, ET.ParseError):
        return ["<no report: the run itself failed>"]
    out = []
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            out.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    return out


def one_run(i: int, n: int, extra: list[str], tmp: Path) -> tuple[float, int, list[str]]:
    report = tmp / f"run{i}.xml"
    started = time.monotonic()
    rc = subprocess.call([*PYTEST, f"--junitxml={report}", *extra], cwd=ROOT)
    took = time.monotonic() - started
    failed = failed_tests(report) if rc else []
    if rc and not failed:
        failed = [f"<run exited {rc} with no failed test in its report>"]
    print(f"# run {i}/{n}: rc {rc}, {took / 60:.1f} min, {len(failed)} failed", flush=True)
    return took, rc, failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5, help="how many runs (default 5)")
    ap.add_argument("--no-burner", action="store_true", help="run on an otherwise idle box")
    ap.add_argument("extra", nargs="*", help="more pytest arguments (after --)")
    args = ap.parse_args(argv)
    burner = None if args.no_burner else subprocess.Popen(BURNER)
    fails: Counter[str] = Counter()
    times: list[float] = []
    try:
        with tempfile.TemporaryDirectory(prefix="politeproxy-repeat-") as tmp:
            for i in range(1, args.n + 1):
                took, _rc, failed = one_run(i, args.n, args.extra, Path(tmp))
                times.append(took)
                fails.update(set(failed))
    finally:
        if burner is not None:
            burner.kill()
            burner.wait()
    print(
        f"\n# {args.n} runs{'' if args.no_burner else ' beside one CPU burner'}: "
        + ", ".join(f"{t / 60:.1f}" for t in times)
        + " min"
    )
    if not fails:
        print("# no test failed")
        return 0
    print(f"# {len(fails)} tests failed at least once (runs failed of {args.n}):")
    for name, count in fails.most_common():
        print(f"{count}  {name}")
    return 1


if __name__ == "__main__":
    sys.exit(main())
