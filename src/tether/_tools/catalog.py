"""The catalog: every tool a program may call, by address ``namespace.name``.

The catalog is the one place that knows which tools exist. Search, stubs and
describe are derived from it; they cache what they derive with
:meth:`Catalog.memo`, which forgets a value as soon as the catalog changes
(``version`` moves on every add, remove or summary change).
"""

from __future__ import annotations

import difflib
import json
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Literal, TypeVar

from tether._tools.model import Tool
from tether.errors import DuplicateTool, InvalidArguments, UnknownTool

if TYPE_CHECKING:
    # jsonschema (with referencing, attrs, rpds: ~15 ms) is imported when a tool's arguments are first
    # checked, not with the catalog: a program that calls no tool (and `import tether`) never needs it.
    from jsonschema.exceptions import ValidationError
    from jsonschema.protocols import Validator

T = TypeVar("T")

# Programs and models sometimes write the address as they call it.
_CALL_PREFIX = "tools."

# Long values in error messages would drown the field names, which are the point.
_MAX_VALUE_CHARS = 40


class Catalog:
    """Tools by address, plus a one-line summary per namespace."""

    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._summaries: dict[str, str] = {}
        self._version = 0
        self._memo: dict[str, tuple[int, Any]] = {}
        # False: the tool's schema is itself invalid, so only names are checked.
        self._validators: dict[str, Validator | Literal[False]] = {}
        self.add_many(tools)

    # --- changing it ---------------------------------------------------------

    def add(self, tool: Tool) -> None:
        """Add one tool; an address already present is a ``duplicate_tool`` error."""
        if tool.address in self._tools:
            raise DuplicateTool(
                f"tool {tool.address} is already in the catalog",
                next_action="Give one of the tools another name or namespace.",
                details={"address": tool.address},
            )
        self._tools[tool.address] = tool
        self._changed()

    def add_many(self, tools: Iterable[Tool]) -> None:
        """Add several tools; stops at the first duplicate (earlier ones stay added)."""
        for tool in tools:
            self.add(tool)

    def remove(self, address: str) -> Tool:
        """Remove and return a tool (``UnknownTool`` if absent)."""
        tool = self.get(address)
        del self._tools[tool.address]
        self._validators.pop(tool.address, None)
        self._changed()
        return tool

    def set_namespace_summary(self, namespace: str, text: str) -> None:
        """Set the one line shown for a namespace by ``sources()`` and the prompt."""
        self._summaries[namespace] = " ".join(text.split())
        self._changed()

    def _changed(self) -> None:
        self._version += 1

    # --- reading it ----------------------------------------------------------

    @property
    def version(self) -> int:
        """A counter that moves whenever the catalog changes; key caches on it."""
        return self._version

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, address: object) -> bool:
        return isinstance(address, str) and _normalise(address) in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools())

    def tools(self) -> list[Tool]:
        """All tools, sorted by address so every derived text is order-independent."""
        return list(self.memo("catalog.tools", lambda: sorted(list(self._tools.values()), key=lambda t: t.address)))

    def find(self, address: str) -> Tool | None:
        """The tool at ``address``, or None: no suggestions are looked for (see ``get``)."""
        return self._tools.get(_normalise(address) if isinstance(address, str) else address)

    def get(self, address: str) -> Tool:
        """The tool at ``address``; ``UnknownTool`` with suggestions if there is none."""
        key = _normalise(address) if isinstance(address, str) else address
        tool = self._tools.get(key)
        if tool is not None:
            return tool
        suggestions = self.suggest(str(address))
        hint = f"; did you mean {', '.join(suggestions)}?" if suggestions else ""
        raise UnknownTool(
            f"no tool {address!r}{hint}",
            details={"address": str(address), "suggestions": suggestions},
        )

    def suggest(self, address: str, limit: int = 5) -> list[str]:
        """Addresses close to ``address``: by whole address, then by tool name alone."""
        wanted = _normalise(address).lower()
        tools = list(self._tools.values())  # one copy: the loop may add tools while a thread suggests
        by_lower = {t.address.lower(): t.address for t in tools}
        found = difflib.get_close_matches(wanted, list(by_lower), n=limit, cutoff=0.6)
        # A right name in the wrong (or no) namespace is the commonest slip.
        name = wanted.rpartition(".")[2]
        by_name: dict[str, list[str]] = {}
        for tool in tools:
            by_name.setdefault(tool.name.lower(), []).append(tool.address)
        for close in difflib.get_close_matches(name, list(by_name), n=limit, cutoff=0.75):
            found.extend(a.lower() for a in sorted(by_name[close]))
        out: list[str] = []
        for lower in found:
            real = by_lower[lower]
            if real not in out:
                out.append(real)
        return out[:limit]

    def namespaces(self) -> list[dict[str, Any]]:
        """``[{"namespace", "tools": count, "summary"}]`` sorted by namespace."""
        return self.memo("catalog.namespaces", self._namespaces)

    def _namespaces(self) -> list[dict[str, Any]]:
        names: dict[str, list[str]] = {}
        for tool in self.tools():
            names.setdefault(tool.namespace, []).append(tool.name)
        return [
            {
                "namespace": ns,
                "tools": len(tool_names),
                "summary": self._summaries.get(ns) or _derived_summary(tool_names),
            }
            for ns, tool_names in sorted(names.items())
        ]

    def memo(self, key: str, build: Callable[[], T]) -> T:
        """Return ``build()``'s value, rebuilt only when the catalog has changed."""
        # Built on the host-work threads too (_hostwork.py) while the loop may add tools: a value is kept
        # under the version it was built from, so one built across a change is built again next time.
        version = self._version
        hit = self._memo.get(key)
        if hit is not None and hit[0] == version:
            return hit[1]  # type: ignore[no-any-return]
        value = build()
        self._memo[key] = (version, value)
        return value

    # --- arguments -----------------------------------------------------------

    def validate_args(self, address: str, args: Any) -> dict[str, Any]:
        """Check ``args`` against the tool's input schema and return them.

        Raises ``InvalidArguments`` naming every missing, unknown or ill-typed
        field in plain words; ``details["errors"]`` lists them as
        ``{"field", "problem"}``. Keys the schema does not declare are refused
        unless it says ``additionalProperties`` may be given, because the
        stubs the program was checked against refuse them too.
        """
        tool = self.get(address)
        if not isinstance(args, dict):
            raise InvalidArguments(
                f"{tool.address}: arguments must be keyword arguments (an object), got {_json_type(args)}",
                details={"address": tool.address, "errors": [{"field": "", "problem": "not an object"}]},
            )
        problems = _problems(tool.input_schema, args, self.validator(tool))
        if problems:
            raise InvalidArguments(
                f"{tool.address}: " + "; ".join(p["problem"] for p in problems),
                details={"address": tool.address, "errors": problems},
            )
        return args

    def validator(self, tool: Tool) -> Validator | Literal[False]:
        validator = self._validators.get(tool.address)
        if validator is None:
            import jsonschema
            from jsonschema.exceptions import SchemaError

            from tether._tools.regexes import bounded

            cls = bounded(jsonschema.validators.validator_for(tool.input_schema,
                                                              default=jsonschema.Draft202012Validator),
                          tool.input_schema)
            try:
                cls.check_schema(tool.input_schema)
                validator = cls(tool.input_schema)
            except SchemaError:
                # A tool author's broken schema must not make the tool uncallable:
                # keep the name checks, which need no valid schema.
                validator = False
            self._validators[tool.address] = validator
        return validator


def accepts_extra_args(schema: dict[str, Any]) -> bool:
    """Whether a tool's input schema lets a caller pass keys it does not name.

    Only an explicit ``additionalProperties``/``patternProperties`` or a
    top-level combinator opens it: the stubs make every other tool strict,
    and validation agrees with the stubs.
    """
    extra = schema.get("additionalProperties")
    if extra is not None and extra is not False:
        return True
    return any(k in schema for k in ("patternProperties", "anyOf", "oneOf", "allOf", "$ref"))


def _normalise(address: str) -> str:
    return address[len(_CALL_PREFIX) :] if address.startswith(_CALL_PREFIX) else address


def _derived_summary(tool_names: list[str]) -> str:
    shown = ", ".join(tool_names[:4])
    return f"{shown}, …" if len(tool_names) > 4 else shown


# --- plain-word schema errors -------------------------------------------------


def _problems(schema: dict[str, Any], args: dict[str, Any],
              validator: Validator | Literal[False]) -> list[dict[str, str]]:
    problems: list[dict[str, str]] = []
    props = schema.get("properties") or {}
    if not accepts_extra_args(schema) and "additionalProperties" not in schema:
        for key in args:
            if key not in props:
                problems.append({"field": key, "problem": _unknown(key, props)})
    if validator is False:
        for key in schema.get("required") or []:
            if key not in args:
                problems.append({"field": key, "problem": f"missing required argument {key!r}"})
        return problems
    errors = sorted(validator.iter_errors(args), key=lambda e: [str(p) for p in e.absolute_path])
    for error in errors:
        problems.extend(_explain(error))
    return problems


def _explain(error: ValidationError) -> list[dict[str, str]]:
    path = [str(p) for p in error.absolute_path]
    where = ".".join(path)
    kind = error.validator
    instance = error.instance
    # Typed "or unset" for hand-made errors; every error a validator yields has it.
    value: Any = error.validator_value
    if kind == "required" and isinstance(instance, dict):
        out = []
        for key in value:
            if key not in instance:
                field = ".".join([*path, key])
                what = "argument" if not path else "field"
                out.append({"field": field, "problem": f"missing required {what} {field!r}"})
        return out
    if kind == "additionalProperties" and isinstance(instance, dict):
        props = (error.schema.get("properties") if isinstance(error.schema, dict) else None) or {}
        out = []
        for key in instance:
            if key not in props:
                field = ".".join([*path, key])
                out.append({"field": field, "problem": _unknown(field, props)})
        return out
    subject = f"argument {where!r}" if len(path) == 1 else (f"field {where!r}" if path else "arguments")
    if kind == "type":
        expected = " or ".join(value) if isinstance(value, list) else value
        return [{"field": where, "problem": f"{subject} must be {expected}, got {_json_type(instance)} {_short(instance)}"}]
    if kind == "enum":
        allowed = ", ".join(_short(v) for v in value)
        return [{"field": where, "problem": f"{subject} must be one of {allowed}, got {_short(instance)}"}]
    if kind == "const":
        return [{"field": where, "problem": f"{subject} must be {_short(error.validator_value)}, got {_short(instance)}"}]
    if kind in ("anyOf", "oneOf"):
        return [{"field": where, "problem": f"{subject} matches none of its allowed shapes, got {_short(instance)}"}]
    message = error.message
    if len(message) > 120:
        message = message[:117] + "..."
    return [{"field": where, "problem": f"{subject}: {message}"}]


def _unknown(field: str, props: dict[str, Any]) -> str:
    key = field.rpartition(".")[2]
    close = difflib.get_close_matches(key, list(props), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    what = "argument" if "." not in field else "field"
    return f"unknown {what} {field!r}{hint}"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _short(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False, default=repr)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."
