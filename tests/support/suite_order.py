"""The order the suite runs its files in: the costliest first, so no long file starts late and ends the run
on one worker while the others sit idle.

pytest hands out whole files (``--dist loadfile`` with ``--no-loadscope-reorder``: in the collection order,
see pyproject.toml); a worker takes the next file when it is done with one. tests/conftest.py sorts the
collection by ``COSTS`` (the seconds a file took, setup and teardown included), keeping each file's tests
together and in their order; a file not listed costs 0 and keeps its place among the cheap ones. A stale
figure only moves a file in the queue: no test depends on the order.

To measure again (the whole suite, ~10 min):

    .venv/bin/python -m pytest -q -p no:cacheprovider --durations=0 > /tmp/dur.log
    .venv/bin/python -m tests.support.suite_order /tmp/dur.log   # prints the new table
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

# Seconds per file, 2026-12-06 (2,149 tests, -n 2, the box busy with other work too): files of 4 s or more.
COSTS: dict[str, int] = {
    "tests/e2e/test_boto3_jobs.py": 145,  # issue 41: six jobs of 200 clients (2026-12-07, -n 0, a busy box)
    "tests/e2e/test_client_answers.py": 115,  # a 60 s loop of refusals and a 40 s hold
    "tests/e2e/test_client_recipes.py": 30,
    "tests/slow/test_bench_smoke.py": 86,
    "tests/e2e/test_request_window.py": 67,  # 82 with the defaults test's 40 s load (25 s now)
    "tests/slow/test_redis_cluster.py": 72,
    "tests/e2e/test_fair_across_proxies.py": 65,
    "tests/faults/test_redis_outage.py": 68,  # issue 42: the restart test waits 4 s longer
    "tests/e2e/test_java_recipe.py": 39,
    "tests/faults/test_corrupt_records.py": 39,
    "tests/e2e/test_cache.py": 38,
    "tests/e2e/test_forward_hardening.py": 36,
    "tests/e2e/test_blocks.py": 36,
    "tests/e2e/test_pipelines.py": 35,
    "tests/e2e/test_exempt_ceiling.py": 30,
    "tests/e2e/test_config_cli.py": 29,
    "tests/e2e/test_workers.py": 35,  # issue 42: a worker killed and restarted, ~7 s
    "tests/e2e/test_simulate.py": 28,
    "tests/e2e/test_backoff_e2e.py": 26,
    "tests/e2e/test_bad_input.py": 25,
    "tests/e2e/test_proxies_seen.py": 22,
    "tests/e2e/test_cache_flight.py": 21,
    "tests/e2e/test_reload.py": 21,
    "tests/e2e/test_cache_keys.py": 19,
    "tests/e2e/test_startup_faults.py": 19,
    "tests/e2e/test_signal_causes.py": 19,
    "tests/faults/test_kill_restart.py": 19,
    "tests/e2e/test_redis_processes.py": 18,
    "tests/slow/test_pacing_accuracy.py": 17,
    "tests/e2e/test_adaptive.py": 17,
    "tests/e2e/test_gaps_layout.py": 16,
    "tests/e2e/test_index_answers.py": 20,  # issue 43: five proxies, cdx_toolkit processes, a 3 s rest (-n 0)
    "tests/slow/test_metrics_prometheus.py": 16,
    "tests/faults/test_upstream_faults.py": 15,
    "tests/unit/policy/test_parsers_property.py": 15,
    "tests/slow/test_proxy_memory.py": 14,
    "tests/e2e/test_java_env.py": 14,
    "tests/e2e/test_env_install.py": 14,
    "tests/e2e/test_ca.py": 12,
    "tests/unit/stores/test_window_stores.py": 11,
    "tests/e2e/test_release.py": 30,  # issue 42: 15 s of releases against a blocking CloudFront
    "tests/e2e/test_services.py": 11,
    "tests/e2e/test_exempt.py": 11,
    "tests/slow/test_status_page_browser.py": 10,
    "tests/slow/test_status_screenshot.py": 10,
    "tests/test_layout_rules.py": 10,
    "tests/e2e/test_destinations.py": 10,
    "tests/e2e/test_front_limits.py": 10,
    "tests/e2e/test_access.py": 10,
    "tests/e2e/test_doctor.py": 9,
    "tests/e2e/test_exec.py": 12,  # issue 45: eleven exec runs, pyarrow and duckdb among them
    "tests/e2e/test_simulate_job.py": 12,  # issue 45: a 10 s job on the stand-in
    "tests/unit/commands/test_simulate.py": 9,
    "tests/e2e/test_pacing_hardening.py": 9,
    "tests/e2e/test_redis_url.py": 8,
    "tests/e2e/test_failover_guard.py": 7,
    "tests/e2e/test_pipeline_names.py": 7,
    "tests/e2e/test_ca_names.py": 7,
    "tests/e2e/test_ccrawl_compat.py": 7,
    "tests/unit/stores/test_records_property.py": 6,
    "tests/e2e/test_clients.py": 6,
    "tests/e2e/test_env_duckdb.py": 6,
    "tests/e2e/test_duckdb15.py": 6,
    "tests/e2e/test_bypass_e2e.py": 6,
    "tests/e2e/test_logs_operator.py": 6,
    "tests/e2e/test_ca_constraints.py": 6,
    "tests/e2e/test_env_pipeline_password.py": 6,
    "tests/e2e/test_cache_clients.py": 6,
    "tests/e2e/test_index_answers_redis.py": 10,  # issue 43: two proxies, a redis-server, cdx_toolkit (-n 0)
    "tests/e2e/test_fastnet_e2e.py": 5,
    "tests/unit/proxy/test_robots_fetch.py": 5,
    "tests/e2e/test_cache_desync.py": 5,
    "tests/test_reportguard.py": 5,
    "tests/e2e/test_ca_files.py": 5,
    "tests/e2e/test_front_door.py": 5,
    "tests/faults/test_cache_kill.py": 4,
    "tests/e2e/test_proxy_bodies.py": 4,
    "tests/unit/commands/test_simulate_vs_pacer.py": 4,
    "tests/e2e/test_env_flags.py": 4,
    "tests/e2e/test_passage.py": 4,
    "tests/e2e/test_pipeline_tokens.py": 4,
}


class _Item(Protocol):
    @property
    def nodeid(self) -> str: ...


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def by_cost(items: Sequence[_Item]) -> list[_Item]:
    """``items`` with the costliest files first. A stable sort on the file's cost: the tests of one file stay
    together (they were together: pytest collects file by file) and in their order, and so do files of
    equal cost."""
    return sorted(items, key=lambda item: -COSTS.get(file_of(item.nodeid), 0))


def costs_from_durations(text: str, least: float = 4.0) -> dict[str, int]:
    """A ``COSTS`` table from pytest's ``--durations=0`` output: each file's setup, call and teardown times
    summed, the files of at least ``least`` seconds, costliest first."""
    per_file: defaultdict[str, float] = defaultdict(float)
    for m in re.finditer(r"^([0-9.]+)s (?:setup|call|teardown) +(\S+)", text, re.M):
        per_file[file_of(m.group(2))] += float(m.group(1))
    ranked = sorted(per_file.items(), key=lambda kv: -kv[1])
    return {name: round(secs) for name, secs in ranked if secs >= least}


def main(argv: list[str]) -> int:
    table = costs_from_durations(Path(argv[0]).read_text())
    print("COSTS: dict[str, int] = {")
    for name, secs in table.items():
        print(f'    "{name}": {secs},')
    print("}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
