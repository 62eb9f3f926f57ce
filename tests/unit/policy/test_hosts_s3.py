"""No silent bypass (issue 13, item 4), the pure parts: S3 host patterns in any region, the CA's name
constraints they need, and path-style S3 classified like the bucket."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from politeproxy.config.loading import ConfigError, build
from politeproxy.policy.classify import MAX_HOSTS_REMEMBERED, Classifier, Klass, bucket_request
from politeproxy.policy.hosts import (
    AWS_REGIONS,
    DEFAULT_PACED_HOSTS,
    S3_PATH_STYLE_HOSTS,
    HostSet,
    host_matches,
    is_covered,
    is_region,
    valid_hostname,
    validate_pattern,
)

FORMS = ("s3.{}", "s3.dualstack.{}", "s3-fips.{}", "s3-fips.dualstack.{}", "s3-{}")
DEFAULT = HostSet()
PATH_STYLE = HostSet(build({"intercept_s3_path_style": True}).paced_hosts)
SUBTREES = {False: DEFAULT.permitted_subtrees(), True: PATH_STYLE.permitted_subtrees()}


@pytest.mark.parametrize(
    ("host", "paced"),
    [
        ("commoncrawl.s3.amazonaws.com", True),
        ("commoncrawl.s3.us-east-1.amazonaws.com", True),
        ("commoncrawl.s3.ap-southeast-5.amazonaws.com", True),  # missing from the old built-in list
        ("commoncrawl.s3.mx-central-1.amazonaws.com", True),
        ("commoncrawl.s3.xx-future-9.amazonaws.com", True),  # any region-shaped label
        ("commoncrawl.s3.dualstack.us-east-1.amazonaws.com", True),
        ("commoncrawl.s3-fips.us-east-1.amazonaws.com", True),
        ("commoncrawl.s3-fips.dualstack.us-gov-west-1.amazonaws.com", True),
        ("commoncrawl.s3-us-west-2.amazonaws.com", True),  # legacy dash form
        ("commoncrawl.s3-external-1.amazonaws.com", True),
        ("COMMONCRAWL.S3.US-EAST-1.AMAZONAWS.COM.", True),
        ("commoncrawl.s3.evil.amazonaws.com", False),
        ("commoncrawl.s3.dualstack.amazonaws.com", False),
        ("commoncrawl.s3.us-east-1a.amazonaws.com", False),
        ("commoncrawl.s3.us-east-1.amazonaws.com.evil.example", False),
        ("x.commoncrawl.s3.us-east-1.amazonaws.com", False),
        ("other.s3.us-east-1.amazonaws.com", False),
        ("commoncrawl.s3-fips.amazonaws.com", False),
        ("commoncrawl.s3-.amazonaws.com", False),
        ("s3.amazonaws.com", False),  # path-style is opt-in
        ("s3.us-east-1.amazonaws.com", False),
    ],
)
def test_s3_variants_without_a_region_list(host: str, paced: bool) -> None:
    assert DEFAULT.matches(host) is paced
    assert any(host_matches(host, p) for p in DEFAULT_PACED_HOSTS) is paced


@pytest.mark.parametrize(
    "label",
    ["us-east-1", "us-gov-west-1", "ap-southeast-7", "mx-central-1", "eu-isoe-west-1", "il-central-1"],
)
def test_region_shape_accepts_regions(label: str) -> None:
    assert is_region(label)


@pytest.mark.parametrize(
    "label",
    [
        "",
        "dualstack",
        "fips",
        "evil",
        "external-1",
        "us-east-1a",
        "us-east",
        "u-east-1",
        "us-east-123",
        "x" * 30,
    ],
)
def test_region_shape_refuses_the_rest(label: str) -> None:
    assert not is_region(label)


def test_every_known_region_is_region_shaped() -> None:
    assert all(is_region(r) for r in AWS_REGIONS)


def test_ca_constraints_cover_every_known_region_in_every_form_and_nothing_else() -> None:
    permitted = DEFAULT.permitted_subtrees()
    for region in AWS_REGIONS:
        for form in FORMS:
            assert is_covered(f"commoncrawl.{form.format(region)}.amazonaws.com", permitted)
    # Only the bucket's names and Common Crawl's own: a leaked CA key cannot sign for the rest of AWS.
    assert all(n == "commoncrawl.org" or n.startswith("commoncrawl.s3") for n in permitted), permitted
    assert not is_covered("s3.amazonaws.com", permitted)
    assert not is_covered("sts.amazonaws.com", permitted)
    assert all(valid_hostname(n) for n in permitted)


def test_path_style_constraints_cover_s3_endpoints_but_not_all_of_aws() -> None:
    permitted = PATH_STYLE.permitted_subtrees()
    for region in AWS_REGIONS:
        for form in FORMS:
            assert is_covered(f"{form.format(region)}.amazonaws.com", permitted)
    assert is_covered("s3.amazonaws.com", permitted) and is_covered("s3-external-1.amazonaws.com", permitted)
    assert all(n == "commoncrawl.org" or n.startswith("s3") for n in permitted), permitted
    assert not is_covered("sts.amazonaws.com", permitted) and "amazonaws.com" not in permitted


def test_path_style_is_off_by_default_and_a_bool() -> None:
    assert build({}).paced_hosts == list(DEFAULT_PACED_HOSTS)
    assert build({"intercept_s3_path_style": True}).paced_hosts == [
        *DEFAULT_PACED_HOSTS,
        *S3_PATH_STYLE_HOSTS,
    ]
    with pytest.raises(ConfigError, match="intercept_s3_path_style"):
        build({"intercept_s3_path_style": "yes"})


@pytest.mark.parametrize(
    ("pattern", "ok"),
    [
        ("commoncrawl.s3-*.amazonaws.com", True),
        ("commoncrawl.s3.*.amazonaws.com", True),
        ("commoncrawl.s3*.amazonaws.com", False),  # '*' inside a label only as '-*'
        ("commoncrawl.*-s3.amazonaws.com", False),
        ("commoncrawl.s3.*.*.amazonaws.com", False),
        ("a.s3-*.com", False),  # a region needs two labels after it
        ("-*.x.example", False),
        ("commoncrawl.s3-" + "a" * 40 + "-*.amazonaws.com", False),  # no room left for a region
    ],
)
def test_region_patterns_validate(pattern: str, ok: bool) -> None:
    assert (validate_pattern(pattern) is None) is ok


@pytest.mark.parametrize(
    ("method", "host", "path", "has_range", "want"),
    [
        ("GET", "s3.amazonaws.com", "/commoncrawl/crawl-data/CC-MAIN-2024-10/x.warc.gz", False, Klass.PACED),
        (
            "GET",
            "s3.us-east-1.amazonaws.com",
            "/commoncrawl?list-type=2&prefix=cc-index/",
            False,
            Klass.PACED,
        ),
        ("GET", "s3.dualstack.us-east-1.amazonaws.com", "/commoncrawl/x", False, Klass.PACED),
        (
            "GET",
            "s3.amazonaws.com",
            "/commoncrawl/cc-index/table/x.parquet",
            True,
            Klass.EXEMPT,
        ),  # as the bucket
        ("GET", "s3.amazonaws.com", "/x/../commoncrawl/crawl-data/y", False, Klass.PACED),  # resolved path
        ("GET", "s3.amazonaws.com", "/common%63rawl/crawl-data/y", False, Klass.PACED),
        ("GET", "s3.amazonaws.com", "//commoncrawl/y", False, Klass.PACED),
        ("PUT", "s3.amazonaws.com", "/my-bucket/commoncrawl/x", False, Klass.PASSTHROUGH),
        ("GET", "s3.amazonaws.com", "/commoncrawl-mirror/x", False, Klass.PASSTHROUGH),
        ("GET", "s3.amazonaws.com", "/", False, Klass.PASSTHROUGH),  # ListBuckets
        (
            "GET",
            "commoncrawl.s3.amazonaws.com",
            "/my-bucket/x",
            False,
            Klass.PACED,
        ),  # virtual-hosted: the bucket
    ],
)
def test_path_style_classified_like_the_bucket(
    method: str, host: str, path: str, has_range: bool, want: Klass
) -> None:
    assert Classifier(PATH_STYLE).classify(method, host, path, has_range) is want


def test_path_style_hosts_pass_when_not_opted_in() -> None:
    assert (
        Classifier(DEFAULT).classify("GET", "s3.amazonaws.com", "/commoncrawl/x", False) is Klass.PASSTHROUGH
    )


text = st.text(
    st.sampled_from("commoncrawl.s3-*dualstackfipsuswest1gov2.amazonaws/%?.\x00 \n[]:ÄЖ"), max_size=80
)


@settings(max_examples=500, deadline=None)
@given(host=text, pattern=text)
@example(host="commoncrawl.s3-.amazonaws.com", pattern="commoncrawl.s3-*.amazonaws.com")
@example(host="commoncrawl.s3.us-east-1.amazonaws.com", pattern="*")
def test_host_patterns_never_raise(host: str, pattern: str) -> None:
    """Any text as a host or a pattern: validate_pattern, host_matches, is_region and HostSet.matches answer
    (a bool or a message) and never raise; a pattern that validates gives a HostSet whose every CA
    constraint is a valid host name."""
    err = validate_pattern(pattern)
    assert err is None or isinstance(err, str)
    assert isinstance(is_region(host), bool)
    if err is None:
        assert isinstance(host_matches(host, pattern), bool)
        hs = HostSet([pattern])
        assert hs.matches(host) == host_matches(host, pattern)
        assert all(valid_hostname(n) for n in hs.permitted_subtrees())
    assert isinstance(PATH_STYLE.matches(host), bool)


@settings(max_examples=100, deadline=None)
@given(region=st.sampled_from(AWS_REGIONS), form=st.sampled_from(FORMS), path_style=st.booleans())
def test_every_matched_known_region_name_is_signable(region: str, form: str, path_style: bool) -> None:
    """A host in a known region that the host set paces is covered by the CA's constraints (so it is
    intercepted, not refused); with path-style, S3's own endpoint too."""
    hs = PATH_STYLE if path_style else DEFAULT
    for host in (f"commoncrawl.{form.format(region)}.amazonaws.com", f"{form.format(region)}.amazonaws.com"):
        if hs.matches(host):
            assert is_covered(host, SUBTREES[path_style])


@settings(max_examples=500, deadline=None)
@given(
    host=text,
    path=st.text(max_size=80),
    method=st.sampled_from(["GET", "HEAD", "PUT", "x"]),
    rng=st.booleans(),
)
@example(host="s3.amazonaws.com", path="/commoncrawl", method="GET", rng=False)
@example(host="s3.amazonaws.com", path="%", method="GET", rng=False)
def test_path_style_classification_never_raises(host: str, path: str, method: str, rng: bool) -> None:
    """Any host and path text: bucket_request and classify answer and never raise; a request that is
    the bucket's keeps a path that starts with '/'."""
    got = bucket_request(host, path)
    assert got is None or got[1].startswith("/")
    assert Classifier(PATH_STYLE).classify(method, host, path, rng) in set(Klass)


def test_a_wildcard_over_a_top_level_domain_is_refused() -> None:
    """``*.org`` would make the CA's constraint a whole top-level domain (found by the property above)."""
    assert validate_pattern("*.org") is not None and validate_pattern("*.a") is not None
    assert validate_pattern("*.commoncrawl.org") is None


def test_remembered_answers_stay_the_answers() -> None:
    """host_matches and HostSet.matches remember answers (bounded); asked twice, they answer the same."""
    hs = HostSet()
    names = ("data.commoncrawl.org", "commoncrawl.s3.mx-central-1.amazonaws.com", "example.com", "x" * 300)
    for host in names:
        assert hs.matches(host) == hs.matches(host) == hs._matches(host)
        assert host_matches(host, "*.commoncrawl.org") == host_matches(host, "*.commoncrawl.org")


def _classify_plainly(c: Classifier, method: str, host: str, path: str, rng: bool) -> Klass:
    """classify as its definition says, every rule asked in full (no rules remembered per host)."""
    if not c.hosts.matches(host):
        return Klass.PASSTHROUGH
    if PATH_STYLE_ONLY.matches(host):
        as_bucket = bucket_request(host, path)
        if as_bucket is None:
            return Klass.PASSTHROUGH
        host, path = as_bucket
    return Klass.EXEMPT if any(r.matches(method, host, path, rng) for r in c.rules) else Klass.PACED


PATH_STYLE_ONLY = HostSet(S3_PATH_STYLE_HOSTS)
NAMES = ["data.commoncrawl.org", "DATA.commoncrawl.org.", "commoncrawl.s3.amazonaws.com", "s3.amazonaws.com",
         "commoncrawl.s3.us-east-1.amazonaws.com", "s3.eu-west-2.amazonaws.com"]  # fmt: skip
PATHS = ["/cc-index/table/a", "/commoncrawl/cc-index/table/x", "/projects/host-index-v3/p", "/crawl-data/x",
         "/cc-index/table/../../crawl-data/x"]  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(
    calls=st.lists(
        st.tuples(
            st.sampled_from(["GET", "get", "HEAD", "PUT"]),
            st.one_of(st.sampled_from(NAMES), text),
            st.sampled_from(PATHS),
            st.booleans(),
        ),
        max_size=30,
    ),
    reload_at=st.integers(0, 30),
)
def test_remembered_rules_classify_as_every_rule_asked_in_full(
    calls: list[tuple[str, str, str, bool]], reload_at: int
) -> None:
    """The rules remembered per host (Classifier.rules_for) give the class the plain definition gives,
    across a reload that changes the rules."""
    c = Classifier(PATH_STYLE)
    for i, (method, host, path, rng) in enumerate(calls):
        if i == reload_at:
            c.reload(tuple(r for r in c.rules if r.path == "/cc-index/table/"))
        assert c.classify(method, host, path, rng) is _classify_plainly(c, method, host, path, rng)


def test_rules_remembered_for_client_chosen_names_stay_bounded() -> None:
    c = Classifier(HostSet(["*.s3.amazonaws.com"]))
    for i in range(3 * MAX_HOSTS_REMEMBERED):
        c.classify("GET", f"b{i}.s3.amazonaws.com", "/x", False)
    assert len(c._by_host) <= MAX_HOSTS_REMEMBERED
