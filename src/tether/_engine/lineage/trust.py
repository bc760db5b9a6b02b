"""Where a tool's results come from: the trust labels ``[[sources]]`` gives (P-45, D-64).

A source's table may say ``trust = "trusted" | "untrusted"`` for all its tools, ``trust_tools`` per tool
name and ``trust_fields`` per field of a tool's result (``"<tool>.<field>[.<field>...]"``, list indices left
out); ``roles`` says which arguments of a tool are destinations or content where names and schemas do not
(``"<tool>.<argument>" = "destination" | "content"``). What no table labels is untrusted: a source tether
cannot see into may return text anyone wrote (an inbox, files, web pages, chat), so only an operator who
knows a tool reads what the user or the operator put there marks it trusted (docs/security.md, "Lineage").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

TRUSTED = "trusted"
UNTRUSTED = "untrusted"
# What a tool without a label gets (D-64).
DEFAULT = UNTRUSTED

# The keys of a mark's path (values.Mark.path: "[2].body", ".to[0]", "['a.b']"), list indices dropped.
_KEY = re.compile(r"\.([^.\[\]]+)|\[(?:'([^']*)'|\"([^\"]*)\")\]")


def path_keys(path: str) -> tuple[str, ...]:
    """The keys along ``path``, without list indices: ``"[3].from.address"`` -> ``("from", "address")``."""
    return tuple(next(g for g in m.groups() if g is not None) for m in _KEY.finditer(path))


@dataclass(frozen=True)
class ToolTrust:
    """One tool's label, and the labels of fields of its result that differ from it."""

    label: str
    fields: tuple[tuple[tuple[str, ...], str], ...] = ()  # (keys, label), the longest first

    @property
    def untrusted(self) -> bool:
        """Whether any part of a result can be untrusted: the tool counts as untrusted for the static pass,
        which cannot tell one field of a result from another."""
        return self.label == UNTRUSTED or any(label == UNTRUSTED for _, label in self.fields)

    def label_at(self, path: str) -> str:
        """The label of a value found at ``path`` of a result: the longest field override that is a prefix
        of its keys, else the tool's."""
        if not self.fields:
            return self.label
        keys = path_keys(path)
        for prefix, label in self.fields:
            if keys[:len(prefix)] == prefix:
                return label
        return self.label


@dataclass
class Labels:
    """The labels of the sources a process loaded, by namespace."""

    by_namespace: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    _cache: dict[str, ToolTrust] = field(default_factory=dict, repr=False)

    def roles_of(self, address: str) -> dict[str, str]:
        """The roles the source's ``roles`` table gives arguments of ``address`` ("<tool>.<argument>" keys)."""
        namespace, _, name = address.partition(".")
        table = (self.by_namespace.get(namespace) or {}).get("roles") or {}
        return {arg: str(role) for key, role in table.items() for tool, _, arg in [str(key).partition(".")]
                if tool == name and arg}

    def of(self, address: str) -> ToolTrust:
        found = self._cache.get(address)
        if found is None:
            found = self._cache[address] = _tool_trust(self.by_namespace, address)
        return found


def _tool_trust(by_namespace: Mapping[str, Mapping[str, Any]], address: str) -> ToolTrust:
    namespace, _, name = address.partition(".")
    table = by_namespace.get(namespace) or {}
    label = (table.get("trust_tools") or {}).get(name) or table.get("trust") or DEFAULT
    fields = []
    for key, value in (table.get("trust_fields") or {}).items():
        tool, _, rest = str(key).partition(".")
        if tool == name and rest:
            fields.append((tuple(rest.split(".")), str(value)))
    fields.sort(key=lambda f: -len(f[0]))
    return ToolTrust(str(label), tuple(fields))


_KEYS = ("trust", "trust_tools", "trust_fields", "roles")


def labels_from(sources: Iterable[tuple[str | None, Mapping[str, Any]]]) -> Labels:
    """Labels from ``(namespace, recorded definition)`` pairs (tether._sources.loader.LoadedSource)."""
    out: dict[str, Mapping[str, Any]] = {}
    for namespace, definition in sources:
        name = namespace or definition.get("namespace")
        if isinstance(name, str) and any(k in definition for k in _KEYS):
            out[name] = {k: definition.get(k) for k in _KEYS}
    return Labels(out)
