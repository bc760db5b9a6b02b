"""Where a tool's results come from: the trust labels ``[[sources]]`` gives (P-45, D-64).

A source's table may say ``trust = "trusted" | "untrusted"`` for all its tools, ``trust_tools`` per tool
name and ``trust_fields`` per field of a tool's result (``"<tool>.<field>[.<field>...]"``, list indices left
out); ``roles`` says which arguments of a tool are destinations or content where names and schemas do not
(``"<tool>.<argument>" = "destination" | "content"``). What no table labels is untrusted: a source tether
cannot see into may return text anyone wrote (an inbox, files, web pages, chat), so only an operator who
knows a tool reads what the user or the operator put there marks it trusted (docs/security.md, "Lineage").
"""

from __future__ import annotations

import ast
import functools
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from tether._engine.lineage.roles import DESTINATION
from tether._engine.lineage.values import KEY_CHARS

if TYPE_CHECKING:
    from tether._tools.catalog import Catalog

TRUSTED = "trusted"
UNTRUSTED = "untrusted"
# What a tool without a label gets (D-64).
DEFAULT = UNTRUSTED

def path_keys(path: str) -> tuple[str, ...]:
    """The keys along ``path`` (values.Mark.path: ``"[2].body"``, ``".to[0]"``, ``"['a.b']"``), without list indices:
    ``"[3].from.address"`` -> ``("from", "address")``.

    Read as values._key_path writes it — ``.name`` for an identifier, ``[repr(key)]`` for any other key — so a key a
    result's author chose (``a'b"c``, ``x'".owner]``, a backslash) is one key, never read as other keys or none: a
    path misread could put an untrusted value under a trusted field (P-45, D-73). Each step moves forward, so any
    string ends; what does not read as a path ends in a key no field names."""
    keys: list[str] = []
    i, n = 0, len(path)
    while i < n:
        c = path[i]
        if c == ".":
            j = i + 1
            while j < n and path[j] not in ".[":
                j += 1
            keys.append(path[i + 1:j])
            i = j
        elif c == "[" and i + 1 < n and path[i + 1] in "'\"":
            quote, j = path[i + 1], i + 2
            while j < n and path[j] != quote:
                j += 2 if path[j] == "\\" else 1
            key = _literal(path[i + 1:j + 1])
            if key is None or path[j + 1:j + 2] != "]":
                return (*keys, _UNREAD)
            keys.append(key)
            i = j + 2
        elif c == "[" and (j := path.find("]", i)) > i and path[i + 1:j].isdigit():
            i = j + 1  # a list index
        else:
            return (*keys, _UNREAD)
    return tuple(keys)


# What ends the keys of a path that is not one values._key_path wrote: no field is named so (a NUL byte).
_UNREAD = "\x00"


@functools.lru_cache(maxsize=4096)
def _literal(text: str) -> str | None:
    """A key as ``repr`` quoted it, or None when ``text`` is not one quoted string."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return value if isinstance(value, str) else None


def _matches(keys: tuple[str, ...], prefix: tuple[str, ...], label: str) -> bool:
    """Whether field ``prefix`` holds the value at ``keys``. A path keeps ``KEY_CHARS`` of a key, so a longer field
    name matches a key cut to its start only for an untrusted label: never can a key another party chose borrow a
    trusted field's label by sharing its first characters, nor a long untrusted field go unrecognised (D-73)."""
    if len(keys) < len(prefix):
        return False
    for key, part in zip(keys, prefix):
        if key == part:
            continue
        if label == UNTRUSTED and len(part) > KEY_CHARS and len(key) == KEY_CHARS and part.startswith(key):
            continue
        return False
    return True


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
        of its keys, else the tool's — but untrusted under no key at all when any field is untrusted."""
        if not self.fields:
            return self.label
        keys = path_keys(path)
        for prefix, label in self.fields:
            if _matches(keys, prefix, label):
                return label
        if not keys and self.untrusted:
            # Under no key (the result is text, or a list of text: an MCP tool without structuredContent): where
            # an untrusted field's text went cannot be told, so none of it counts as trusted (D-73).
            return UNTRUSTED
        return self.label


@dataclass
class Labels:
    """The labels of the sources a process loaded, by namespace, and those tools carry themselves (a Python
    tool's ``@tool(trust=...)``, D-73), by address. Where both label one tool the stricter wins, field by field
    and argument by argument: "untrusted" over "trusted", "destination" over "content" (D-73)."""

    by_namespace: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    by_tool: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    _cache: dict[str, ToolTrust] = field(default_factory=dict, repr=False)

    def roles_of(self, address: str) -> dict[str, str]:
        """The roles the source's ``roles`` table ("<tool>.<argument>" keys) and the tool's own ``roles`` give
        arguments of ``address``."""
        namespace, _, name = address.partition(".")
        out = _table_roles(self.by_namespace.get(namespace) or {}, name)
        for arg, role in ((self.by_tool.get(address) or {}).get("roles") or {}).items():
            out[arg] = DESTINATION if DESTINATION in (role, out.get(arg)) else str(role)
        return out

    def of(self, address: str) -> ToolTrust:
        found = self._cache.get(address)
        if found is None:
            found = self._cache[address] = _tool_trust(self.by_namespace, self.by_tool, address)
        return found

    def disagreements(self) -> list[str]:
        """Where a ``[[sources]]`` table and a tool's own labels say different things, and what holds: one line
        each, for the log (D-73: never silent)."""
        out = []
        for address, own in sorted(self.by_tool.items()):
            namespace, _, name = address.partition(".")
            table = self.by_namespace.get(namespace)
            if not table:
                continue
            theirs = _side(table, name)
            mine = _side(own, None)
            for keys in sorted(set(theirs[1]) | set(mine[1]) | {()}):
                a, b = _resolve(*theirs, keys), _resolve(*mine, keys)
                if a is not None and b is not None and a != b:
                    where = f"field {'.'.join(keys)} of " if keys else ""
                    out.append(f"{where}{address}: the [[sources]] table says {a}, the tool says {b}; "
                               f"{_stricter(a, b)} holds")
            roles = self.roles_of(address)
            table_roles = _table_roles(table, name)
            for arg, role in sorted((own.get("roles") or {}).items()):
                if arg in table_roles and table_roles[arg] != role:
                    out.append(f"argument {arg} of {address}: the [[sources]] table says {table_roles[arg]}, the "
                               f"tool says {role}; {roles[arg]} holds")
        return out


def _table_roles(table: Mapping[str, Any], name: str) -> dict[str, str]:
    """The roles a ``[[sources]]`` table's ``roles`` ("<tool>.<argument>" keys) give arguments of tool ``name``."""
    return {arg: str(role) for key, role in (table.get("roles") or {}).items()
            for tool, _, arg in [str(key).partition(".")] if tool == name and arg}


def _stricter(a: str | None, b: str | None) -> str | None:
    """The label that asks more of two (None: no label): untrusted over trusted (D-73)."""
    if a is None or b is None:
        return a if b is None else b
    return UNTRUSTED if UNTRUSTED in (a, b) else a


def _side(table: Mapping[str, Any], name: str | None) -> tuple[str | None, dict[tuple[str, ...], str]]:
    """One side's label for a tool and its field labels by keys: a ``[[sources]]`` table's for tool ``name``, or
    (``name`` None) a tool's own (its ``trust_fields`` keys have no tool name)."""
    if name is None:
        label = table.get("trust")
        fields = {tuple(str(k).split(".")): str(v) for k, v in (table.get("trust_fields") or {}).items()}
        return (str(label) if label else None), fields
    label = (table.get("trust_tools") or {}).get(name) or table.get("trust")
    fields = {}
    for key, value in (table.get("trust_fields") or {}).items():
        tool, _, rest = str(key).partition(".")
        if tool == name and rest:
            fields[tuple(rest.split("."))] = str(value)
    return (str(label) if label else None), fields


def _resolve(label: str | None, fields: Mapping[tuple[str, ...], str], keys: tuple[str, ...]) -> str | None:
    """What one side says of the value at ``keys``: its longest field override that is a prefix, else its tool's."""
    best: tuple[str, ...] | None = None
    for prefix in fields:
        if keys[:len(prefix)] == prefix and (best is None or len(prefix) > len(best)):
            best = prefix
    return fields[best] if best is not None else label


def _longest_first(field: tuple[tuple[str, ...], str]) -> tuple[int, bool]:
    """The order label_at tries fields in: the longest first and, of two as long that could both hold a path (a
    key cut to KEY_CHARS), the untrusted one."""
    return -len(field[0]), field[1] != UNTRUSTED


def _tool_trust(by_namespace: Mapping[str, Mapping[str, Any]], by_tool: Mapping[str, Mapping[str, Any]],
                address: str) -> ToolTrust:
    namespace, _, name = address.partition(".")
    theirs = _side(by_namespace.get(namespace) or {}, name)
    own = by_tool.get(address)
    if own is None:
        return ToolTrust(theirs[0] or DEFAULT, tuple(sorted(theirs[1].items(), key=_longest_first)))
    mine = _side(own, None)
    # Every key either side names, labelled by what both sides say there: label_at then gives, for any path,
    # the stricter of what each side alone would give it (its longest prefix is in the union).
    keys = set(theirs[1]) | set(mine[1])
    fields = [(k, _stricter(_resolve(*theirs, k), _resolve(*mine, k)) or DEFAULT) for k in keys]
    fields.sort(key=_longest_first)
    return ToolTrust(_stricter(theirs[0], mine[0]) or DEFAULT, tuple(fields))


_KEYS = ("trust", "trust_tools", "trust_fields", "roles")
_TOOL_KEYS = ("trust", "trust_fields", "roles")


def labels_from(sources: Iterable[tuple[str | None, Mapping[str, Any]]], tools: Iterable[Any] = ()) -> Labels:
    """Labels from ``(namespace, recorded definition)`` pairs (tether._sources.loader.LoadedSource) and the
    tools of a catalog (tether._tools.model.Tool: its own ``trust``, ``trust_fields``, ``roles``). The one
    place the guard's labels are built (D-73)."""
    out: dict[str, Mapping[str, Any]] = {}
    for namespace, definition in sources:
        name = namespace or definition.get("namespace")
        if isinstance(name, str) and any(k in definition for k in _KEYS):
            out[name] = {k: definition.get(k) for k in _KEYS}
    return Labels(out, tool_labels(tools))


def tool_labels(tools: Iterable[Any]) -> dict[str, Mapping[str, Any]]:
    """The labels tools carry themselves, by address; tools without any are left out."""
    out: dict[str, Mapping[str, Any]] = {}
    for tool in tools:
        own = {k: getattr(tool, k, None) for k in _TOOL_KEYS}
        if any(v is not None for v in own.values()):
            out[tool.address] = own
    return out


_log = logging.getLogger("tether.lineage")
# Disagreements already logged by this process (each once, not once per guarded attempt), bounded.
_SAID: set[str] = set()


def guard_labels(sources: Iterable[tuple[str | None, Mapping[str, Any]]], catalog: "Catalog") -> Labels:
    """The labels a guarded attempt judges by: the loaded sources' tables and the catalog's labelled tools (kept
    with the catalog until it changes: a catalog of 1,000 tools is not walked per attempt). A table and a tool
    that disagree are logged once (D-73)."""
    labelled = catalog.memo("lineage.labelled", lambda: [t for t in catalog.tools() if
                                                         t.trust is not None or t.trust_fields or t.roles])
    labels = labels_from(sources, labelled)
    if labels.by_tool and labels.by_namespace:
        for line in labels.disagreements():
            if line not in _SAID and len(_SAID) < 1024:
                _SAID.add(line)
                _log.warning("trust labels disagree (D-73): %s", line)
    return labels
