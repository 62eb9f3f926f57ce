"""Settings arrive typed (issue 44 item 1): the table's section classes are the one declaration of every key,
a loaded config is a set of frozen sections built from it, and a new setting is one line of the table.

The last tests hold the rule in place: no literal default outside the table, and no part of the package
outside config/ reads a config as a dict.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
import sys
import typing
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from politeproxy.config import loading
from politeproxy.config.loading import build, load
from politeproxy.config.reference import render
from politeproxy.policy import table
from politeproxy.policy.settings import ConfigError
from politeproxy.policy.table import SECTION_CLASSES, SETTINGS, Sections

PACKAGE = Path(loading.__file__).resolve().parents[1]

# The annotation each kind of value is held as (what config/loading.py's converters give, frozen).
TYPE_OF_KIND = {
    "bool": "bool",
    "int": "int",
    "float": "float",
    "duration": "float",
    "rate": "float",
    "size": "int",
    "count or auto": "int | str",
    "ports": "tuple[int, ...]",
    "status codes": "tuple[int, ...]",
    "cidr list": "tuple[str, ...]",
    "host patterns": "tuple[str, ...]",
    "names": "tuple[str, ...]",
    "users": "Mapping[str, str]",
    "resolve table": "Mapping[str, str]",
    "exempt rules": "Rules",
    "cache rules": "Rules",
    "client rules": "Rules",
}


def test_every_field_of_every_section_is_one_line_of_the_table() -> None:
    keys = []
    for cls, name in SECTION_CLASSES.items():
        keys += [f"{name}.{f.name}" if name else f.name for f in dataclasses.fields(cls)]
    assert keys == [s.key for s in SETTINGS]  # the same keys, in the same order: nothing else declares one
    assert {f.name for f in dataclasses.fields(Sections)} == {
        name.removesuffix(".*") or "general" for name in SECTION_CLASSES.values()
    }, "a section class without its field in Sections (or the other way round)"


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.key)
def test_a_fields_type_follows_its_kind(s: Any) -> None:
    table_name, _, field_name = s.key.rpartition(".")
    cls = next(c for c, name in SECTION_CLASSES.items() if name == table_name)
    annotation = {f.name: f.type for f in dataclasses.fields(cls)}[field_name]
    assert annotation == TYPE_OF_KIND.get(s.kind, "str"), f"{s.key} ({s.kind}) is typed {annotation}"


def test_the_defaults_are_the_tables_and_a_loaded_config_agrees() -> None:
    assert build({}).sections == Sections()
    for s in SETTINGS:
        if "*" not in s.key:
            assert Sections().value(s.key) == table.freeze(s.default), s.key


def test_a_loaded_config_is_typed_and_frozen(tmp_path: Path) -> None:
    path = tmp_path / "pp.toml"
    path.write_text(
        'allow_clients = ["10.0.0.0/8"]\n[client]\nidle_timeout = "5s"\n[auth]\nusers = { ann = "pw" }\n'
        '[hosts."index.commoncrawl.org"]\ninterval = "2s"\n[pipelines.bulk]\nweight = 2\n'
        '[[exempt.rules]]\nhost = "x.example.org"\n'
    )
    s = load(path).sections
    assert s.client.idle_timeout == 5.0 and isinstance(s.client.idle_timeout, float)
    assert s.general.allow_clients == ("10.0.0.0/8",)  # lists arrive as tuples
    assert s.hosts is not None and s.hosts["index.commoncrawl.org"].interval == 2.0
    assert s.pipelines["bulk"].weight == 2.0 and s.pipelines["bulk"].max_queued == 0
    assert s.exempt.rules is not None and s.exempt.rules[0]["methods"] == ("GET", "HEAD")
    assert isinstance(s.auth.users, MappingProxyType)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.client.idle_timeout = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.auth.users["eve"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        s.client.__class__(idle_timeout=1.0, nonsense=2)  # type: ignore[call-arg]  # keywords only, known ones


def test_a_reload_is_a_new_set_of_sections(tmp_path: Path) -> None:
    path = tmp_path / "pp.toml"
    path.write_text('[robots]\nttl = "2m"\n')
    old = load(path)
    path.write_text('[robots]\nttl = "3m"\n[schedule]\nbackend = "memory"\n')
    new = load(path)
    assert (old.sections.robots.ttl, new.sections.robots.ttl) == (120.0, 180.0)
    assert old.restart_changes(new) == ["schedule.backend"]
    assert old.changes(new) == ["robots.ttl: 2m -> 3m", "schedule.backend: 'file' -> 'memory'"]


# -- a new setting is one line of the table ------------------------------------------------------------

_NEW_LINE = (
    '    probe_burst: int = S("int", default=4, doc="a throwaway key of this test", bounds=(1, 100), '
    "reload=True)\n"
)


@pytest.fixture
def grown_table(monkeypatch: pytest.MonkeyPatch) -> Any:
    """policy/table.py with one more line in [pacing], and nothing else changed, as a module of its own."""
    source = Path(table.__file__).read_text(encoding="utf-8")
    anchor = "    index_rest: float = S("
    assert source.count(anchor) == 1
    spec = importlib.util.spec_from_loader("grown_table", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "grown_table", module)
    exec(compile(source.replace(anchor, _NEW_LINE + anchor), "grown_table", "exec"), module.__dict__)
    return module


def test_a_new_setting_is_one_line_of_the_table(grown_table: Any) -> None:
    """The architecture page's "Adding a setting": the line alone gives the key its schema, its check, its
    error line, its typed field with the default, its reload flag and its row in the reference."""
    t = grown_table
    entry = t.BY_KEY["pacing.probe_burst"]
    assert (entry.kind, entry.default, entry.reload) == ("int", 4, True)
    assert [s.key for s in t.SETTINGS if s.key != "pacing.probe_burst"] == [s.key for s in SETTINGS]
    assert t.Sections().pacing.probe_burst == 4  # the typed section gains the field, at the table's default
    assert "pacing.probe_burst" not in t.restart_only()
    schema = loading._schema(t.SETTINGS)
    tree = loading._section({"pacing": {"probe_burst": 9}}, schema, "")
    assert t.sections_from(tree).pacing.probe_burst == 9  # loaded, checked and typed
    assert t.sections_from(loading._section({}, schema, "")).pacing.probe_burst == 4
    with pytest.raises(ConfigError, match=r"pacing\.probe_burst: expected a value from 1 to 100"):
        loading._section({"pacing": {"probe_burst": 500}}, schema, "")
    assert "| `pacing.probe_burst` | int | `4` | 1 to 100 | reload |" in render(t.SETTINGS)


def test_the_real_table_does_not_have_the_throwaway_key() -> None:
    assert "pacing.probe_burst" not in table.BY_KEY and not hasattr(Sections().pacing, "probe_burst")


# -- the rules that keep it so ------------------------------------------------------------------------


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _is_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        f = d.func if isinstance(d, ast.Call) else d
        if (isinstance(f, ast.Name) and f.id == "dataclass") or (
            isinstance(f, ast.Attribute) and f.attr == "dataclass"
        ):
            return True
    return False


def _literal(node: ast.expr | None) -> Any:
    try:
        return ast.literal_eval(node) if node is not None else None
    except ValueError:
        return None


# Key defaults too common to mean anything when they turn up as a literal elsewhere (off, on, one, none).
_TRIVIAL = (0, 1, 2, "", (), None, True, False)


def _repeats(name: str, value: Any) -> list[str]:
    """The table keys whose default ``value`` repeats: any key for a telling number, else a key whose
    name the field's ends like (``exempt_rate`` for exempt.rate, ``idle`` for client.idle_timeout)."""
    out = []
    for s in SETTINGS:
        if s.default is None or isinstance(s.default, bool) != isinstance(value, bool):
            continue
        if table.freeze(s.default) != table.freeze(value):
            continue
        section, _, last = s.key.rpartition(".")
        named = name in (last, f"{section}_{last}", last.removesuffix("_timeout"))
        telling = isinstance(value, int | float) and value not in _TRIVIAL
        if named or telling:
            out.append(s.key)
    return out


def test_no_dataclass_repeats_a_default_of_the_table() -> None:
    """A literal default in a dataclass of the package that equals a table default: it should be the
    table's, through ``from_table`` (or the part should be handed its section)."""
    found = []
    for path in _modules():
        if path.name == "table.py" and path.parent.name == "policy":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ClassDef) and _is_dataclass(node)):
                continue
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) and item.value:
                    value = _literal(item.value)
                    if value is not None and (keys := _repeats(item.target.id, value)):
                        where = f"{path.relative_to(PACKAGE.parent)}:{item.lineno}"
                        found.append(f"{where} {node.name}.{item.target.id} = {value!r} ({', '.join(keys)})")
    assert not found, "literal defaults that repeat the table:\n" + "\n".join(found)


def test_the_scan_finds_what_it_is_for() -> None:
    """The scan above, on the dataclass literals this issue removed (pacing/base.py before it)."""
    old = (
        "@dataclass(frozen=True)\nclass P:\n"
        "    max_wait: float = 25.0\n    exempt_rate: float = 0.1\n    x: int = 1\n"
    )
    cls = next(n for n in ast.walk(ast.parse(old)) if isinstance(n, ast.ClassDef))
    assert _is_dataclass(cls)
    fields = [i for i in cls.body if isinstance(i, ast.AnnAssign) and isinstance(i.target, ast.Name)]
    hits = {i.target.id: _repeats(i.target.id, _literal(i.value)) for i in fields}  # type: ignore[union-attr]
    assert hits == {"max_wait": ["pacing.max_wait"], "exempt_rate": ["exempt.rate"], "x": []}


# Reading a loaded config as a dict: ``cfg["schedule"]``, ``config.raw``, ``cfg.get("...")``.
_DICT_READ = re.compile(r"\b(?:cfg|config|self\.cfg|new|old)(?:\[[\"']|\.raw\b|\.get\([\"'])")


def test_no_part_outside_config_reads_a_config_as_a_dict() -> None:
    found = []
    for path in _modules():
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] == "config":
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if _DICT_READ.search(line) and "headers" not in line:
                found.append(f"politeproxy/{rel}:{n}: {line.strip()}")
    assert not found, "read the typed sections (cfg.sections.<section>.<key>) instead:\n" + "\n".join(found)


def test_annotations_resolve() -> None:
    """Every section's annotations name real types (a typo in one would only show under a type checker)."""
    for cls in SECTION_CLASSES:
        hints = typing.get_type_hints(cls, vars(table))
        assert set(hints) == {f.name for f in dataclasses.fields(cls)}, cls
