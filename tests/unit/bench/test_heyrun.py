"""bench/heyrun.py reads hey's text report (the reports below are hey's own, trimmed of its histogram)."""

from __future__ import annotations

import math

import pytest

from bench.heyrun import hey, parse

ANSWERED = """
Summary:
  Total:	0.0884 secs
  Slowest:	0.0150 secs
  Fastest:	0.0034 secs
  Average:	0.0087 secs
  Requests/sec:	226.1894

  Total data:	294740 bytes
  Size/request:	14737 bytes

Response time histogram:


Latency distribution:
  10% in 0.0039 secs
  25% in 0.0053 secs
  50% in 0.0093 secs
  75% in 0.0122 secs
  90% in 0.0138 secs
  95% in 0.0150 secs
  0% in 0.0000 secs

Details (average, fastest, slowest):
  DNS+dialup:	0.0002 secs, 0.0034 secs, 0.0150 secs
  DNS-lookup:	0.0000 secs, 0.0000 secs, 0.0000 secs
  req write:	0.0001 secs, 0.0000 secs, 0.0003 secs
  resp wait:	0.0083 secs, 0.0033 secs, 0.0138 secs
  resp read:	0.0002 secs, 0.0000 secs, 0.0005 secs

Status code distribution:
  [200]	20 responses
"""

# every request refused: hey prints NaN for the average and no percentiles
REFUSED = """
Summary:
  Total:	0.0007 secs
  Slowest:	0.0000 secs
  Fastest:	0.0000 secs
  Average:	 NaN secs
  Requests/sec:	8069.2883


Response time histogram:


Latency distribution:

Details (average, fastest, slowest):
  DNS+dialup:	 NaN secs, 0.0000 secs, 0.0000 secs
  DNS-lookup:	 NaN secs, 0.0000 secs, 0.0000 secs
  req write:	 NaN secs, 0.0000 secs, 0.0000 secs
  resp wait:	 NaN secs, 0.0000 secs, 0.0000 secs
  resp read:	 NaN secs, 0.0000 secs, 0.0000 secs

Status code distribution:

Error distribution:
  [6]	Get "http://127.0.0.1:18778/": dial tcp 127.0.0.1:18778: connect: connection refused
"""

MIXED = """
Summary:
  Requests/sec:\t1500.5000

Latency distribution:
  50% in 0.0120 secs
  99% in 0.0800 secs

Status code distribution:
  [200]\t90 responses
  [206]\t5 responses
  [503]\t3 responses

Error distribution:
  [2]\tGet "https://data.commoncrawl.org/x": context deadline exceeded
"""


def test_an_answered_run_without_a_99th_percentile_takes_the_slowest() -> None:
    r = parse(ANSWERED)
    assert (r.rps, r.p50, r.p99, r.ok, r.errors) == (226.1894, 0.0093, 0.0150, 20, 0)


def test_a_run_nobody_answered_is_read_not_refused() -> None:
    r = parse(REFUSED)
    assert r.ok == 0 and r.errors == 6 and math.isnan(r.p50)


def test_other_answers_and_errors_count_as_errors() -> None:
    r = parse(MIXED)
    assert (r.ok, r.errors, r.p50, r.p99) == (95, 5, 0.012, 0.08)


def test_a_report_without_its_rate_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="cannot parse hey output"):
        parse("hey: connection refused\n")


def test_hey_takes_a_count_or_a_duration() -> None:
    with pytest.raises(ValueError, match="n or duration"):
        hey("http://127.0.0.1:9/", None, 1)
    with pytest.raises(ValueError, match="n or duration"):
        hey("http://127.0.0.1:9/", None, 1, n=1, duration=1.0)
