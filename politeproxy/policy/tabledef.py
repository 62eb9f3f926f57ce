"""How a line of the table of settings (policy/table.py) is declared, and what a section class is made into.

``S(...)`` is one key's entry; ``section(name)`` turns a class of such lines into a frozen, keyword-only
dataclass whose defaults are the entries' (``dataclass_transform`` tells the type checker so), and records
the table name and the entries on the class, from which policy/table.py derives ``SETTINGS``.
Policy core: pure data, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, TypeVar, dataclass_transform

Rules = tuple[Mapping[str, Any], ...] | None  # [[exempt.rules]] and the like: None = the built-in rules
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Setting:
    """One config key: how it is read, its default and bounds, and whether a reload applies it."""

    key: str  # dotted: "schedule.global_rate"; "hosts.*.interval" for a table keyed by name
    kind: str  # a converter's name: "duration", "rate", "int", "bool", "cidr list", ...
    default: Any  # the validated value a missing key gets (tuples stand for lists)
    doc: str  # one line for the reference
    bounds: tuple[float, float] | None = None  # inclusive, in ``unit``
    unit: str = ""  # "s" for durations and rates, "bytes" for sizes
    reload: bool = False  # True: a reload applies it; False: only a restart does
    env: str = ""  # POLITEPROXY_* variable that overrides the file
    flag: str = ""  # command-line flag that overrides the file and the variable
    flag_all: bool = False  # the flag is on every command that reads the config, not only run and env
    choices: tuple[str, ...] = ()  # for kind "choice"

    @property
    def override(self) -> str:
        """The override's name in ``overrides`` mappings: the variable's or the flag's (``global_rate``)."""
        if self.env:
            return self.env.removeprefix("POLITEPROXY_").lower()
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.key.split("."))


def S(  # noqa: N802 - short on purpose: the table is one line per key
    kind: str,
    *,
    default: Any,
    doc: str,
    bounds: tuple[float, float] | None = None,
    unit: str = "",
    reload: bool = False,
    env: str = "",
    flag: str = "",
    flag_all: bool = False,
    choices: tuple[str, ...] = (),
) -> Any:
    """One line of the table: the entry of the field it is assigned to (``section`` fills in its key).

    Typed ``Any`` so that ``max_wait: float = S(...)`` type-checks as the field's type."""
    return Setting("", kind, default, doc, bounds, unit, reload, env, flag, flag_all, choices)


def freeze(value: Any) -> Any:
    """A loaded value as a section holds it: lists as tuples, tables as read-only mappings, all the way in."""
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    if isinstance(value, dict | MappingProxyType):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    return value


_TABLE = "__politeproxy_table__"  # the class attribute that holds a section's table name and entries


def table_of(cls: type) -> tuple[str, tuple[Setting, ...]]:
    """A section class's table name ("" for the top-level keys, "hosts.*" for [hosts.<name>]) and entries."""
    got: tuple[str, tuple[Setting, ...]] = getattr(cls, _TABLE)
    return got


def is_section(value: object) -> bool:
    return isinstance(value, type) and hasattr(value, _TABLE)


def _default_of(value: Any) -> Any:
    """The dataclass default of a table default (a mapping, read-only, through a factory: dataclasses refuse
    one as a plain default)."""
    frozen = freeze(value)
    if isinstance(frozen, MappingProxyType):
        return field(default_factory=lambda: frozen)
    return field(default=frozen)


@dataclass_transform(kw_only_default=True, frozen_default=True, field_specifiers=(S,))
def section(name: str) -> Callable[[type[_T]], type[_T]]:
    """Make a class of ``S(...)`` lines a frozen, keyword-only dataclass with the table's defaults."""

    def make(cls: type[_T]) -> type[_T]:
        entries = []
        for attr, value in list(vars(cls).items()):
            if isinstance(value, Setting):
                entries.append(replace(value, key=f"{name}.{attr}" if name else attr))
                setattr(cls, attr, _default_of(value.default))
        made = dataclass(frozen=True, slots=True, kw_only=True)(cls)
        setattr(made, _TABLE, (name, tuple(entries)))
        return made

    return make
