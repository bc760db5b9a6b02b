"""The pre-run check of a program's tool calls: what it reaches, and whether its calls fit.

Parsing the program with :mod:`ast` costs microseconds and depends on the
program, not on the catalog. From the tree it learns:

* which tools the program names (``tools.ns.name``, through any alias:
  ``import tools as t``, ``from tools import ns``, ``from tools.ns import f``,
  a tool bound to a variable) — only those need stubs for the full check;
* which namespaces (or the whole ``tools`` module) it reaches dynamically,
  e.g. ``getattr(tools.ns, name)`` — those need their whole stubs;
* whether each call it can see fits its tool: the address exists, no more
  positional arguments than the tool takes, no argument given twice, no
  unknown or missing argument, and literal values of the right type.

It must never refuse a program that would run: anything it cannot judge
statically (``*args``, ``**kwargs``, a rebound alias, syntax the host's
Python cannot parse) is left to the boundary at run time. A problem is
reported with the same code and suggestions as at run time, plus the line and
column.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from tether._tools.binding import positional_problem, signature_text
from tether._tools.catalog import Catalog, _explain, _unknown, accepts_extra_args
from tether._tools.model import Tool
from tether._tools.params import parameters
from tether.errors import InvalidArguments, ProgramSyntaxError, TetherError, UnknownTool

_MODULE = "tools"
# A parse and a walk are cheap, but agents resend the same program (retries,
# sessions); remembering the last few verdicts makes those free.
_CACHE_SIZE = 256


@dataclass(frozen=True)
class Reach:
    """What a program can reach of the catalog."""

    addresses: frozenset[str] = frozenset()  # tools named statically
    namespaces: frozenset[str] = frozenset()  # namespaces reached dynamically: all their tools
    everything: bool = False  # `tools` itself used as a value: the whole catalog
    parsed: bool = True  # False: the host's Python could not parse it; nothing was judged


EVERYTHING = Reach(everything=True, parsed=False)


@dataclass
class _Scan:
    modules: set[str] = field(default_factory=set)  # names bound to the `tools` module
    namespaces: dict[str, str] = field(default_factory=dict)  # name -> namespace it is bound to
    functions: dict[str, str] = field(default_factory=dict)  # name -> address it is bound to
    rebound: set[str] = field(default_factory=set)  # names also assigned otherwise
    origin: dict[str, ast.AST] = field(default_factory=dict)  # name -> the import that bound it
    bound_otherwise: set[str] = field(default_factory=set)  # bound by def, parameter, except, global...
    star: bool = False  # `from tools import *`


def check_program(code: str, catalog: Catalog) -> Reach:
    """What ``code`` reaches; raises the first problem found in its tool calls.

    Raises ``ProgramSyntaxError`` (``syntax_error``), ``UnknownTool`` or
    ``InvalidArguments`` with ``details`` holding ``line`` and ``column``.
    Verdicts are remembered per catalog version (``Catalog.memo``).
    """
    cache: OrderedDict[str, Reach | TetherError] = catalog.memo("precheck", OrderedDict)
    key = hashlib.blake2b(code.encode(), digest_size=16).hexdigest()
    hit = cache.get(key)
    if hit is None:
        try:
            hit = _check(code, catalog)
        except TetherError as exc:
            hit = exc
        cache[key] = hit
        if len(cache) > _CACHE_SIZE:
            cache.popitem(last=False)
    else:
        cache.move_to_end(key)
    if isinstance(hit, TetherError):
        raise hit.with_traceback(None)
    return hit


def remembered(code: str, catalog: Catalog) -> bool:
    """Whether :func:`check_program`'s verdict on ``code`` is remembered for this catalog version.

    Then checking it is a dictionary lookup, which the caller may do on the event loop rather than pay
    a thread's round trip for (core_bench.py: ~0.2 ms an execute on a busy machine).
    """
    cache: OrderedDict[str, Reach | TetherError] = catalog.memo("precheck", OrderedDict)
    return hashlib.blake2b(code.encode(), digest_size=16).hexdigest() in cache


def _check(code: str, catalog: Catalog) -> Reach:
    try:
        tree = ast.parse(code)
    except SyntaxError as exc:
        if _monty_may_parse(exc):
            # Newer syntax than the host's Python (3.12 f-strings, `type X = ...`):
            # the sandbox decides; nothing here is judged.
            return EVERYTHING
        line, col = exc.lineno, (exc.offset or 0)
        raise ProgramSyntaxError(
            f"syntax error at line {line}, column {col}: {exc.msg}; nothing was run",
            details={"line": line, "column": col},
        ) from None
    except (ValueError, RecursionError, MemoryError):
        return EVERYTHING
    scan = _bindings(tree)
    _assigned_aliases(tree, scan)
    shadowed = scan.rebound & (scan.modules | set(scan.namespaces) | set(scan.functions))
    for name in shadowed:
        # A name bound both to tools and to something else: judged by the run only.
        scan.modules.discard(name)
        scan.namespaces.pop(name, None)
        scan.functions.pop(name, None)
    if scan.star:
        shadowed.add("*")
    if not (scan.modules or scan.namespaces or scan.functions):
        return Reach(everything=bool(shadowed))
    reach = _Walker(scan, catalog).run(tree)
    return Reach(reach.addresses, reach.namespaces, True) if shadowed else reach


def _monty_may_parse(exc: SyntaxError) -> bool:
    # Python 3.11 refuses what 3.12+ (and Monty) accept: nested quotes in
    # f-strings, generic functions (`def f[T](x: T)`)... Refusing those would
    # be a false rejection; the sandbox's own parser reports real syntax
    # errors, with line and column, before anything runs.
    import sys

    return sys.version_info < (3, 12)


def _assigned_aliases(tree: ast.AST, scan: _Scan) -> None:
    """``gh = tools.github`` / ``get = tools.bench.get``, assigned once: an alias like an import's."""
    stores: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            stores[node.id] = stores.get(node.id, 0) + 1
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name, value = node.targets[0].id, node.value
        if (stores.get(name) != 1 or name in scan.bound_otherwise or name in scan.modules
                or name in scan.namespaces or name in scan.functions):
            continue
        if (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                and value.value.id in scan.modules):
            scan.namespaces[name] = value.attr
        elif (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Attribute)
                and isinstance(value.value.value, ast.Name) and value.value.value.id in scan.modules):
            scan.functions[name] = f"{value.value.attr}.{value.attr}"
        elif (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                and value.value.id in scan.namespaces):
            scan.functions[name] = f"{scan.namespaces[value.value.id]}.{value.attr}"
        else:
            continue
        scan.rebound.discard(name)
        scan.origin[name] = node


def _bindings(tree: ast.AST) -> _Scan:
    scan = _Scan()

    def other(name: str) -> None:
        scan.rebound.add(name)
        scan.bound_otherwise.add(name)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] != _MODULE:
                    other(alias.asname or parts[0])
                    continue
                if alias.asname is None:
                    scan.modules.add(_MODULE)  # `import tools.ns` binds `tools`
                elif len(parts) == 1:
                    scan.modules.add(alias.asname)
                elif len(parts) == 2:
                    scan.namespaces[alias.asname] = parts[1]
                    scan.origin[alias.asname] = node
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] != _MODULE:
                for alias in node.names:
                    other(alias.asname or alias.name)
                continue
            for alias in node.names:
                bound = alias.asname or alias.name
                if alias.name == "*":
                    scan.star = True  # names nobody can list statically: the whole catalog
                    continue
                if len(parts) == 1:
                    scan.namespaces[bound] = alias.name
                elif len(parts) == 2:
                    scan.functions[bound] = f"{parts[1]}.{alias.name}"
                scan.origin[bound] = node
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            scan.rebound.add(node.id)
            if isinstance(node.ctx, ast.Del):
                scan.bound_otherwise.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            other(node.name)
            if not isinstance(node, ast.ClassDef):
                args = node.args
                for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                    if a is not None:
                        other(a.arg)
        elif isinstance(node, ast.Lambda):
            for a in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                other(a.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            other(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                other(name)
        elif isinstance(node, ast.MatchAs) and node.name:
            other(node.name)
        elif isinstance(node, ast.MatchStar) and node.name:
            other(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            other(node.rest)
    return scan


class _Walker:
    def __init__(self, scan: _Scan, catalog: Catalog) -> None:
        self.scan = scan
        self.catalog = catalog
        self.addresses: set[str] = set()
        self.namespaces: set[str] = set()
        self.everything = False
        self._known_ns: set[str] | None = None
        self._seen: set[int] = set()  # ids of nodes already taken as part of a larger pattern

    def run(self, tree: ast.AST) -> Reach:
        for name, address in self.scan.functions.items():
            self._tool(address, self.scan.origin.get(name))
        for name, ns in self.scan.namespaces.items():
            self._namespace(ns, self.scan.origin.get(name))
        for origin in self.scan.origin.values():
            if isinstance(origin, ast.Assign):  # `gh = tools.github`: an alias, not a dynamic reach
                self._seen.update(id(n) for n in ast.walk(origin.value))
        # Calls first, so a call's function is judged with its arguments.
        nodes = list(ast.walk(tree))
        for node in nodes:
            if isinstance(node, ast.Call):
                called = self._address(node.func)
                if called is not None:
                    tool = self._tool(called, node.func)
                    if tool is not None:
                        self._call(tool, node)
        for node in nodes:
            if id(node) in self._seen:
                continue
            if isinstance(node, ast.Attribute):
                named = self._address(node)
                if named is not None:
                    self._tool(named, node)
                    continue
                reached = self._ns_of(node)
                if reached is not None:
                    self._seen.add(id(node.value))
                    self._namespace(reached, node)
                    self.namespaces.add(reached)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                if node.id in self.scan.modules:
                    self.everything = True
                elif node.id in self.scan.namespaces:
                    self.namespaces.add(self.scan.namespaces[node.id])
                elif node.id in self.scan.functions:
                    self.addresses.add(self.scan.functions[node.id])
        return Reach(frozenset(self.addresses), frozenset(self.namespaces), self.everything)

    # -- recognising tools ------------------------------------------------------

    def _address(self, node: ast.AST) -> str | None:
        """The address a `tools.ns.name` / `ns.name` / `name` expression names, if any."""
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in self.scan.functions:
            self._seen.add(id(node))
            return self.scan.functions[node.id]
        if not isinstance(node, ast.Attribute):
            return None
        ns = self._ns_of(node.value)
        if ns is None:
            return None
        self._seen.update((id(node), id(node.value)))
        if isinstance(node.value, ast.Attribute):
            self._seen.add(id(node.value.value))
        return f"{ns}.{node.attr}"

    def _ns_of(self, node: ast.AST) -> str | None:
        """The namespace a `tools.ns` / `ns` expression names, if any."""
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in self.scan.namespaces:
            self._seen.add(id(node))
            return self.scan.namespaces[node.id]
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in self.scan.modules and isinstance(node.value.ctx, ast.Load)):
            self._seen.add(id(node.value))
            return node.attr
        return None

    def _namespace(self, ns: str, node: ast.AST | None) -> None:
        if self._known_ns is None:
            self._known_ns = {entry["namespace"] for entry in self.catalog.namespaces()}
        if ns in self._known_ns:
            return
        if not self._known_ns:
            # Nothing loaded at all is the set-up's problem, not the program's: search() would find nothing.
            raise UnknownTool(
                f"{_at(node)}no namespace {ns!r} in tools: no tools are loaded; nothing was run",
                next_action="Load tools first: --tools with a module or .py file of @tool functions (e.g. --tools "
                            "tether.demo.helpdesk), [[sources]] in tether.toml, or Runtime(tools=[...]); "
                            "`tether sources list` shows what loaded.",
                details={**_where(node), "address": ns, "suggestions": []},
            )
        close = difflib.get_close_matches(ns, sorted(self._known_ns), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownTool(
            f"{_at(node)}no namespace {ns!r} in tools{hint}; nothing was run",
            next_action="Use sources() or search() to find the right namespace.",
            details={**_where(node), "address": ns, "suggestions": close},
        )

    def _tool(self, address: str, node: ast.AST | None) -> Tool:
        self._namespace(address.partition(".")[0], node)
        try:
            tool = self.catalog.get(address)
        except UnknownTool as exc:
            suggestions = exc.details.get("suggestions", [])
            hint = f"did you mean {', '.join(suggestions[:3])}?" if suggestions else "use search() to find it."
            raise UnknownTool(
                f"{_at(node)}{exc.message}; nothing was run",
                next_action=f"Use search() to find the right address; {hint}" if suggestions else
                "Use search() to find the right address.",
                details={**_where(node), **exc.details},
            ) from None
        self.addresses.add(tool.address)
        return tool

    # -- judging a call -----------------------------------------------------------

    def _call(self, tool: Tool, call: ast.Call) -> None:
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            return  # *args / **kwargs: only the run knows what they hold
        names = [k.arg for k in call.keywords if k.arg is not None]
        problem = positional_problem(tool, len(call.args), names)
        if problem is None and len(set(names)) != len(names):
            problem = "got multiple values for a keyword argument"
        if problem is not None:
            self._refuse(tool, call, f"{tool.address}() {problem}; signature: {signature_text(tool)}")
        params = parameters(tool)
        given = dict(zip(params.positional, call.args))
        given.update({k.arg: k.value for k in call.keywords if k.arg is not None})
        schema = tool.input_schema
        props = schema.get("properties") or {}
        found = [f"missing required argument {n!r}" for n in (schema.get("required") or []) if n not in given]
        if not accepts_extra_args(schema):
            found += [_unknown(n, props) for n in given if n not in props]
        # A Python read validates its own arguments with coercion ("5" -> 5):
        # its values are left to it, so nothing it would accept is refused.
        validator = self.catalog.validator(tool) if not (tool.validates_args and not tool.is_write) else False
        if validator is not False:
            for name, node in given.items():
                value = _literal(node) if name in props else _UNKNOWN
                if value is _UNKNOWN:
                    continue
                # Each value against its own property only: a top-level
                # combinator would misjudge the partial view of the call.
                # descend() is on every jsonschema validator class, not on its Validator protocol.
                for error in validator.descend(value, props[name], path=name):  # type: ignore[attr-defined]
                    found += [p["problem"] for p in _explain(error)]
        if found:
            self._refuse(tool, call, f"{tool.address}: " + "; ".join(dict.fromkeys(found)))

    def _refuse(self, tool: Tool, call: ast.Call, message: str) -> None:
        raise InvalidArguments(
            f"{_at(call)}{message}; nothing was run",
            details={**_where(call), "address": tool.address, "signature": signature_text(tool)},
        )


_UNKNOWN = object()


def _literal(node: ast.AST) -> Any:
    """The JSON value a literal argument holds, or _UNKNOWN when only the run can tell."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNKNOWN
    return _json(value)


def _json(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [_json(v) for v in value]
        return _UNKNOWN if any(i is _UNKNOWN for i in items) else items
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return _UNKNOWN
        fields = {k: _json(v) for k, v in value.items()}
        return _UNKNOWN if any(v is _UNKNOWN for v in fields.values()) else fields
    return _UNKNOWN  # bytes, sets, complex: the run decides how they travel


def _where(node: ast.AST | None) -> dict[str, Any]:
    line = getattr(node, "lineno", None) if node is not None else None
    if line is None:
        return {}
    return {"line": line, "column": getattr(node, "col_offset", 0) + 1}


def _at(node: ast.AST | None) -> str:
    where = _where(node)
    return f"line {where['line']}, column {where['column']}: " if where else ""
