"""Which hosts are paced (policy core, no I/O).

A pattern is an exact host name, ``*.suffix`` (one or more labels before ``suffix``), or a name with one
``*`` label in the middle (``commoncrawl.s3.*.amazonaws.com``), where ``*`` stands for exactly one label
and, for S3, only for a known AWS region: the CA's name constraints can only list concrete names, and a
host the constraints do not cover could not be intercepted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

DEFAULT_PACED_HOSTS: tuple[str, ...] = (
    "commoncrawl.org",
    "*.commoncrawl.org",
    "commoncrawl.s3.amazonaws.com",
    "commoncrawl.s3.*.amazonaws.com",
)

# The regions a mid-name wildcard may stand for; the CA lists each in its name constraints.
AWS_REGIONS: tuple[str, ...] = (
    "us-east-1",
    "us-east-2",
    "us-west-1",
    "us-west-2",
    "af-south-1",
    "ap-east-1",
    "ap-south-1",
    "ap-south-2",
    "ap-northeast-1",
    "ap-northeast-2",
    "ap-northeast-3",
    "ap-southeast-1",
    "ap-southeast-2",
    "ap-southeast-3",
    "ap-southeast-4",
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
    "sa-east-1",
    "us-gov-east-1",
    "us-gov-west-1",
)


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


def validate_pattern(pattern: str) -> str | None:
    """Return an error message for a malformed pattern, or None.

    Besides the ``*`` label, a pattern is a valid host name (``valid_hostname``): it reaches the CA's
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
    stars = [i for i, lab in enumerate(labels) if lab == "*"]
    if len(stars) > 1:
        return f"{pattern!r} may hold at most one '*' label"
    for lab in labels:
        if lab != "*" and not _HOSTNAME_LABEL.fullmatch(lab):
            return f"{pattern!r} has an invalid label {lab!r}"
    if stars and stars[0] == len(labels) - 1:
        return f"{pattern!r} may not end in '*'"
    if stars and 0 < stars[0] and len(labels) - stars[0] - 1 < 2:
        return f"{pattern!r}: a mid-name '*' needs two labels after it"
    return None


def host_matches(host: str, pattern: str) -> bool:
    return _labels_match(normalize_host(host), normalize_host(pattern).split("."))


def _labels_match(host: str, labels: list[str]) -> bool:
    """``host`` (normalised) against a pattern split into labels."""
    if labels[0] == "*":
        suffix = ".".join(labels[1:])
        return host.endswith("." + suffix) and len(host) > len(suffix) + 1
    if "*" in labels:
        i = labels.index("*")
        hl = host.split(".")
        if len(hl) != len(labels):
            return False
        return all(h == p for h, p in zip(hl, labels, strict=True) if p != "*") and hl[i] in AWS_REGIONS
    return host == ".".join(labels)


class HostSet:
    """The paced host set: answers "is this host paced?" and "which names must the CA permit?"."""

    def __init__(self, patterns: Iterable[str] = DEFAULT_PACED_HOSTS) -> None:
        self.patterns = tuple(normalize_host(p) for p in patterns)
        # Split once, host normalised once: matches() runs for every request (same answers as host_matches).
        self._split = tuple(normalize_host(p).split(".") for p in self.patterns)

    def matches(self, host: str) -> bool:
        h = normalize_host(host)
        return any(_labels_match(h, labels) for labels in self._split)

    def permitted_subtrees(self) -> list[str]:
        """DNS names for the CA's NameConstraints; each permits itself and all its subdomains."""
        names: set[str] = set()
        for p in self.patterns:
            labels = p.split(".")
            if labels[0] == "*":
                names.add(".".join(labels[1:]))
            elif "*" in labels:
                i = labels.index("*")
                for region in AWS_REGIONS:
                    names.add(".".join(labels[:i] + [region] + labels[i + 1 :]))
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
