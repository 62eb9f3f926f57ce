"""Which hosts are paced (policy core, no I/O).

A pattern is an exact host name, ``*.suffix`` (one or more labels before ``suffix``), or a name with one
region label in the middle: ``*`` (``commoncrawl.s3.*.amazonaws.com``) or a prefix ending in ``-*``
(``commoncrawl.s3-*.amazonaws.com``). A region label matches any label shaped like an AWS region
(``us-east-1``, ``mx-central-1``, ``us-gov-west-1``; ``REGION_SHAPE``), so a region AWS opens tomorrow is
still intercepted, never tunnelled blind. DNS name constraints have no mid-name wildcard, so the CA's
constraints list each known region (``AWS_REGIONS``) for such a pattern: a region-shaped name outside that
list is intercepted and then refused with a 403 that names the fix (add the exact name to paced_hosts).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable

DEFAULT_PACED_HOSTS: tuple[str, ...] = (
    "commoncrawl.org",
    "*.commoncrawl.org",
    "commoncrawl.s3.amazonaws.com",
    "commoncrawl.s3.*.amazonaws.com",
    "commoncrawl.s3.dualstack.*.amazonaws.com",
    "commoncrawl.s3-fips.*.amazonaws.com",
    "commoncrawl.s3-fips.dualstack.*.amazonaws.com",
    "commoncrawl.s3-*.amazonaws.com",  # the legacy dash form (s3-us-west-2)
    "commoncrawl.s3-external-1.amazonaws.com",  # the legacy us-east-1 name
)

# Every name of the commoncrawl bucket among the default patterns (virtual-hosted, regional, dualstack,
# FIPS, the legacy dash forms): one service to Common Crawl (policy/services.py).
BUCKET_HOSTS: tuple[str, ...] = tuple(p for p in DEFAULT_PACED_HOSTS if p.startswith("commoncrawl.s3"))

# S3's own endpoints, paced only with intercept_s3_path_style (policy/classify.py paces only the
# commoncrawl bucket's paths on them); the CA's constraints then cover every bucket on these names.
S3_PATH_STYLE_HOSTS: tuple[str, ...] = (
    "s3.amazonaws.com",
    "s3.*.amazonaws.com",
    "s3.dualstack.*.amazonaws.com",
    "s3-fips.*.amazonaws.com",
    "s3-fips.dualstack.*.amazonaws.com",
    "s3-*.amazonaws.com",
    "s3-external-1.amazonaws.com",
)

# The regions a region label stands for in the CA's name constraints (matching takes any REGION_SHAPE).
AWS_REGIONS: tuple[str, ...] = (
    "us-east-1",
    "us-east-2",
    "us-west-1",
    "us-west-2",
    "af-south-1",
    "ap-east-1",
    "ap-east-2",
    "ap-south-1",
    "ap-south-2",
    "ap-northeast-1",
    "ap-northeast-2",
    "ap-northeast-3",
    "ap-southeast-1",
    "ap-southeast-2",
    "ap-southeast-3",
    "ap-southeast-4",
    "ap-southeast-5",
    "ap-southeast-6",
    "ap-southeast-7",
    "ca-central-1",
    "ca-west-1",
    "eu-central-1",
    "eu-central-2",
    "eu-west-1",
    "eu-west-2",
    "eu-west-3",
    "eu-south-1",
    "eu-south-2",
    "eu-north-1",
    "il-central-1",
    "me-south-1",
    "me-central-1",
    "mx-central-1",
    "sa-east-1",
    "us-gov-east-1",
    "us-gov-west-1",
)

# An AWS region label: a two-letter area, one or two words, a number (us-east-1, us-gov-west-1). Used with
# fullmatch. Shape only: "dualstack", "fips", "evil", "external-1" and anything over 25 characters are not.
REGION_SHAPE = re.compile(r"[a-z]{2}(-[a-z]{1,10}){1,2}-[0-9]{1,2}")


def is_region(label: str) -> bool:
    """True for a label shaped like an AWS region; never raises."""
    return isinstance(label, str) and len(label) <= 25 and REGION_SHAPE.fullmatch(label) is not None


def normalize_host(host: str) -> str:
    """Lower-case, strip a trailing dot and IPv6 brackets; never raises ("" for a non-string)."""
    if not isinstance(host, str):
        return ""
    host = host.strip().lower().rstrip(".")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host


# Used with fullmatch: "$" would also match before a trailing newline, letting "a\n" pass as a label.
_HOSTNAME_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


def valid_hostname(host: str) -> bool:
    """True for a DNS name of RFC 1123 labels (after ``normalize_host``): letters, digits and inner
    hyphens, 1-63 characters a label, at most 253 in all, at least two labels, not all-numeric at the end.

    Client-chosen names are checked with this before they are classified, used as a key, or put near a
    path: ``../x.commoncrawl.org``, ``a/b``, ``a..b`` and names with NUL or spaces are all refused.
    """
    if not isinstance(host, str) or not host or len(host) > 253:
        return False
    labels = host.split(".")
    if len(labels) < 2 or labels[-1].isdigit():
        return False
    return all(_HOSTNAME_LABEL.fullmatch(lab) for lab in labels)


def _region_label(lab: str) -> bool:
    """``*`` or ``<prefix>-*`` with a prefix that leaves room for any region in one 63-character label."""
    if lab == "*":
        return True
    prefix = lab[:-2]
    return lab.endswith("-*") and len(prefix) <= 36 and _HOSTNAME_LABEL.fullmatch(prefix) is not None


def validate_pattern(pattern: str) -> str | None:
    """Return an error message for a malformed pattern, or None.

    Besides its one ``*``, a pattern is a valid host name (``valid_hostname``): it reaches the CA's
    name constraints and the leaf names, so a label with "/", "_", NUL or spaces is refused here.
    """
    p = normalize_host(pattern)
    labels = p.split(".")
    if len(labels) < 2:
        return f"{pattern!r} needs at least two labels"
    if len(p) > 253:
        return f"{pattern!r} is longer than 253 characters"
    if labels[-1].isdigit():
        return f"{pattern!r} is an IP address, not a host name"
    if p.count("*") > 1:
        return f"{pattern!r} may hold at most one '*'"
    stars = [i for i, lab in enumerate(labels) if "*" in lab]
    for lab in labels:
        if "*" in lab and not _region_label(lab):
            return f"{pattern!r}: '*' stands alone or ends a label as '-*' (a region), not in {lab!r}"
        if "*" not in lab and not _HOSTNAME_LABEL.fullmatch(lab):
            return f"{pattern!r} has an invalid label {lab!r}"
    if stars and stars[0] == len(labels) - 1:
        return f"{pattern!r} may not end in '*'"
    if stars and (0 < stars[0] or labels[0] != "*") and len(labels) - stars[0] - 1 < 2:
        return f"{pattern!r}: a region '*' needs two labels after it"
    if labels[0] == "*" and len(labels) < 3:
        # "*.a" would be every name under a top-level domain, and "a" is no CA constraint to give out.
        return f"{pattern!r}: '*.' needs a domain of at least two labels after it"
    return None


@functools.lru_cache(maxsize=4096)  # pure; asked several times per request; the bound caps client names
def host_matches(host: str, pattern: str) -> bool:
    return _labels_match(normalize_host(host), normalize_host(pattern).split("."))


def _region_index(labels: list[str]) -> int:
    """Where a pattern's region label is (-1: none); a leading lone ``*`` is the subdomain wildcard."""
    return next((i for i, lab in enumerate(labels) if "*" in lab and (i or lab != "*")), -1)


def _region_match(hl: list[str], labels: list[str], i: int) -> bool:
    """A host split into labels against a region pattern whose region label is at ``i``."""
    if len(hl) != len(labels):
        return False
    if any(h != p for j, (h, p) in enumerate(zip(hl, labels, strict=True)) if j != i):
        return False
    prefix = labels[i][:-1]  # "" for "*", "s3-" for "s3-*"
    return hl[i].startswith(prefix) and is_region(hl[i][len(prefix) :])


def _labels_match(host: str, labels: list[str]) -> bool:
    """``host`` (normalised) against a pattern split into labels."""
    if labels[0] == "*":
        suffix = ".".join(labels[1:])
        return host.endswith("." + suffix) and len(host) > len(suffix) + 1
    i = _region_index(labels)
    if i >= 0:
        return _region_match(host.split("."), labels, i)
    return host == ".".join(labels)


class HostSet:
    """The paced host set: answers "is this host paced?" and "which names must the CA permit?"."""

    matches: Callable[[str], bool]  # "is this host paced?": ``_matches`` remembered per set (see __init__)

    def __init__(self, patterns: Iterable[str] = DEFAULT_PACED_HOSTS) -> None:
        self.patterns = tuple(normalize_host(p) for p in patterns)
        # Sorted once by kind: matches() runs for every request (same answers as host_matches).
        split = [p.split(".") for p in self.patterns]
        self._exact = frozenset(p for p, lab in zip(self.patterns, split, strict=True) if "*" not in p)
        self._suffixes = tuple("." + ".".join(lab[1:]) for lab in split if lab[0] == "*")
        self._regions = tuple((lab, _region_index(lab)) for lab in split if _region_index(lab) >= 0)
        # Pure per set, asked for every request: remembered per name, bounded (client-chosen names).
        self.matches = functools.lru_cache(maxsize=4096)(self._matches)

    def _matches(self, host: str) -> bool:
        h = normalize_host(host)
        if h in self._exact:
            return True
        if any(h.endswith(s) and len(h) > len(s) for s in self._suffixes):
            return True
        if self._regions:
            hl = h.split(".")
            return any(_region_match(hl, lab, i) for lab, i in self._regions)
        return False

    def permitted_subtrees(self) -> list[str]:
        """DNS names for the CA's NameConstraints; each permits itself and all its subdomains.

        A region label becomes one name per known region (``AWS_REGIONS``): a constraint cannot hold a
        wildcard in the middle, and the one suffix that covers every region (``amazonaws.com``) would let
        the CA sign for all of AWS."""
        names: set[str] = set()
        for p in self.patterns:
            labels = p.split(".")
            i = _region_index(labels)
            if labels[0] == "*":
                names.add(".".join(labels[1:]))
            elif i >= 0:
                prefix = labels[i][:-1]
                for region in AWS_REGIONS:
                    names.add(".".join(labels[:i] + [prefix + region] + labels[i + 1 :]))
            else:
                names.add(p)
        # Drop names already covered by a broader one.
        return sorted(n for n in names if not any(n.endswith("." + m) for m in names if m != n))

    def concrete_hosts(self) -> list[str]:
        """Names to make leaves for at start-up: exact names plus the well-known Common Crawl hosts."""
        out = [p for p in self.patterns if "*" not in p]
        for extra in ("data.commoncrawl.org", "index.commoncrawl.org"):
            if self.matches(extra) and extra not in out:
                out.append(extra)
        return out


def is_covered(host: str, subtrees: Iterable[str]) -> bool:
    host = normalize_host(host)
    return any(host == s or host.endswith("." + s) for s in subtrees)
