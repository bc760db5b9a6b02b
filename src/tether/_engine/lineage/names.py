"""Which variable a name means, and which names reach tools: the static pass's reading of names (D-63).

:class:`Scopes` applies Python's scoping rules (function locals, ``global``, ``nonlocal``, closures that
skip class bodies, comprehension targets, the walrus binding in the enclosing function), enough to tell a
helper's ``x`` from the module's ``x``. :class:`ToolNames` knows the ways a program names a tool, as the
sandbox exposes them (tools/stubs.py): ``import tools [as t]``, ``import tools.ns as n``,
``from tools import ns [as n]``, ``from tools.ns import f [as g]`` and an alias assigned once
(``gh = tools.github``). One walk over the tree fills both and enforces the node cap.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

_TOOLS = "tools"


# Node types that bind a name or open a scope (the others are walked through); the Load/Store singletons
# carry nothing and are skipped; the types ToolNames.see reads.
_BINDING = frozenset({
    ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp,
    ast.GeneratorExp, ast.comprehension, ast.Name, ast.NamedExpr, ast.Import, ast.ImportFrom, ast.ExceptHandler,
    ast.MatchAs, ast.MatchStar, ast.MatchMapping, ast.Global, ast.Nonlocal,
})
_CONTEXTS = frozenset({ast.Load, ast.Store, ast.Del})
_SIMPLE = frozenset({ast.Assign, ast.AnnAssign, ast.AugAssign})
_SEEN_BY_TOOLS = frozenset({
    ast.Import, ast.ImportFrom, ast.Name, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.arg, ast.Assign,
})


class Bail(Exception):
    """Past a cap: the pass gives up and says "cannot tell"."""


# -- scopes ------------------------------------------------------------------------------------------------

COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


class Scope:
    __slots__ = ("node", "parent", "kind", "locals", "globals", "nonlocals", "later")

    def __init__(self, node: ast.AST, parent: "Scope | None", kind: str) -> None:
        self.node = node
        self.parent = parent
        self.kind = kind  # "module" | "function" | "class" | "comprehension"
        # Code here runs at a time the order of the module's statements does not tell: a function's or class's
        # body, a generator expression (lazy; its first iterable too, conservatively).
        self.later: bool = parent is not None and (parent.later or kind in ("function", "class")
                                                   or isinstance(node, ast.GeneratorExp))
        self.locals: set[str] = set()
        self.globals: set[str] = set()
        self.nonlocals: set[str] = set()


class Scopes:
    """Python's scoping rules, enough to tell a helper's ``x`` from the module's ``x``."""

    def __init__(self, tree: ast.Module, tools: "ToolNames", max_nodes: int) -> None:
        self.module = Scope(tree, None, "module")
        self.of: dict[int, Scope] = {id(tree): self.module}
        self.defs: dict[tuple[int, str], list[ast.AST]] = {}  # (scope, name) -> the defs binding it
        self.other: set[tuple[int, str]] = set()  # (scope, name) bound by something other than a def
        self.imported: set[tuple[int, str]] = set()  # (scope, name) bound by a non-tools import only
        # Module names bound only by top-level `x = ...` / `x: T = ...` / `x += ...` and read only in program
        # order: one variable per assignment is then exact (flow.py versions them).
        self.straight: frozenset[str] = frozenset()
        self._simple: set[str] = set()
        self._unordered: set[str] = set()
        self._direct: set[int] = set()  # ids of the Name targets of top-level simple assignments
        top = {id(stmt) for stmt in tree.body}
        # One walk for the scopes, the names bound to tools, the straight names and the node cap.
        stack: list[tuple[ast.AST, Scope]] = [(tree, self.module)]
        count = 0
        while stack:
            node, scope = stack.pop()
            count += 1
            if count > max_nodes:
                raise Bail
            kind = type(node)
            if kind in _SEEN_BY_TOOLS:
                tools.see(node)
            if kind in _SIMPLE and id(node) in top:
                self._direct.update(_direct_targets(node))
            for child in ast.iter_child_nodes(node):
                if type(child) in _CONTEXTS:
                    continue
                stack.append((child, self._enter(child, scope) if type(child) in _BINDING else scope))
        self.straight = frozenset((self._simple - self._unordered) & self.module.locals)

    def _bind(self, scope: Scope, name: str, how: str) -> None:
        scope.locals.add(name)
        key = (id(scope.node), name)
        if how == "import":
            self.imported.add(key)
        else:
            self.other.add(key)

    def _enter(self, node: ast.AST, scope: Scope) -> Scope:
        """Records what ``node`` binds in ``scope``; the scope its children live in."""
        if isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store) and id(node) in self._direct:
                self._simple.add(node.id)
            elif not isinstance(node.ctx, ast.Load) or scope.later:
                self._unordered.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal)):
            self._unordered.update((a if isinstance(a, str) else (a.asname or a.name).split(".")[0])
                                   for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self._unordered.add(node.name)
        elif isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            self._unordered.add(node.target.id)
        elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
            self._unordered.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            self._unordered.add(node.rest)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            scope.locals.add(node.name)
            self.defs.setdefault((id(scope.node), node.name), []).append(node)
            inner = Scope(node, scope, "class" if isinstance(node, ast.ClassDef) else "function")
            self.of[id(node)] = inner
            if not isinstance(node, ast.ClassDef):
                for a in _params(node.args):
                    inner.locals.add(a.arg)
            return inner
        if isinstance(node, ast.Lambda):
            inner = Scope(node, scope, "function")
            self.of[id(node)] = inner
            for a in _params(node.args):
                inner.locals.add(a.arg)
            return inner
        if isinstance(node, COMPREHENSIONS):
            inner = Scope(node, scope, "comprehension")
            self.of[id(node)] = inner
            for gen in node.generators:
                for name in _names_in(gen.target):
                    inner.locals.add(name)
            return inner
        if isinstance(node, ast.comprehension):
            return scope  # its targets were bound by the comprehension
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            if scope.kind == "comprehension" and node.id in scope.locals:
                return scope
            self._bind(scope, node.id, "other")
        elif isinstance(node, ast.NamedExpr) and isinstance(node.target, ast.Name):
            target = scope
            while target.kind == "comprehension" and target.parent is not None:
                target = target.parent  # the walrus binds in the enclosing function (PEP 572)
            self._bind(target, node.target.id, "other")
            return scope
        elif isinstance(node, ast.Import):
            for alias in node.names:
                self._bind(scope, alias.asname or alias.name.split(".")[0], "import")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name != "*":
                    self._bind(scope, alias.asname or alias.name, "import")
        elif isinstance(node, ast.ExceptHandler) and node.name:
            self._bind(scope, node.name, "other")
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            self._bind(scope, node.name, "other")
        elif isinstance(node, ast.MatchMapping) and node.rest:
            self._bind(scope, node.rest, "other")
        elif isinstance(node, ast.Global):
            scope.globals.update(node.names)
        elif isinstance(node, ast.Nonlocal):
            scope.nonlocals.update(node.names)
        return scope

    def resolve(self, scope: Scope, name: str) -> Scope:
        """The scope whose variable ``name`` means in ``scope``."""
        if name in scope.globals:
            return self.module
        if name in scope.locals and name not in scope.nonlocals:
            return scope
        current = scope.parent
        while current is not None:
            if current.kind != "class" or current is self.module:
                if name in current.globals:
                    return self.module
                if name in current.locals and name not in current.nonlocals:
                    return current
            current = current.parent
        return self.module


def _params(args: ast.arguments) -> list[ast.arg]:
    out = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    if args.vararg is not None:
        out.append(args.vararg)
    if args.kwarg is not None:
        out.append(args.kwarg)
    return out


def _names_in(target: ast.AST) -> Iterable[str]:
    for node in ast.walk(target):
        if isinstance(node, ast.Name):
            yield node.id


# -- the names that reach tools -----------------------------------------------------------------------------


class ToolNames:
    """``import tools [as t]``, ``from tools import ns [as n]``, ``from tools.ns import f [as g]``,
    ``import tools.ns as n`` and an alias assigned once (``gh = tools.github``): module-wide names."""

    def __init__(self) -> None:
        self.modules: set[str] = set()
        self.namespaces: dict[str, str] = {}
        self.functions: dict[str, str] = {}
        self.alias_nodes: set[int] = set()  # ids of `x = tools.ns` assignments, taken as aliases
        self.star = False
        self.stores: dict[str, int] = {}
        self.assigns: list[ast.Assign] = []
        self.shadowed: set[str] = set()

    def see(self, node: ast.AST) -> None:
        """Called once per node of the program, in any order."""
        stores = self.stores
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] != _TOOLS:
                    continue
                if alias.asname is None:
                    self.modules.add(_TOOLS)
                elif len(parts) == 1:
                    self.modules.add(alias.asname)
                elif len(parts) == 2:
                    self.namespaces[alias.asname] = parts[1]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            parts = node.module.split(".")
            if parts[0] != _TOOLS:
                return
            for alias in node.names:
                bound = alias.asname or alias.name
                if alias.name == "*":
                    self.star = True
                elif len(parts) == 1:
                    self.namespaces[bound] = alias.name
                elif len(parts) == 2:
                    self.functions[bound] = f"{parts[1]}.{alias.name}"
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            stores[node.id] = stores.get(node.id, 0) + 1
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stores[node.name] = stores.get(node.name, 0) + 2
        elif isinstance(node, ast.arg):
            stores[node.arg] = stores.get(node.arg, 0) + 2
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            self.assigns.append(node)

    def aliases(self) -> None:
        """After every node was seen: the names bound to tools twice, and the aliases assigned once."""
        stores = self.stores
        # A name bound to tools and to anything else is read by the run only: the pass cannot name its calls.
        self.shadowed = {n for n in [*self.modules, *self.namespaces, *self.functions] if n in stores}
        for node in self.assigns:
            name = node.targets[0].id  # type: ignore[attr-defined]
            if stores.get(name) != 1 or name in self.shadowed:
                continue
            ns = self.ns_of(node.value)
            address = self.address(node.value)
            if address is not None:
                self.functions[name] = address
            elif ns is not None:
                self.namespaces[name] = ns
            else:
                continue
            self.alias_nodes.add(id(node))

    def bound(self, name: str) -> bool:
        return name in self.modules or name in self.namespaces or name in self.functions

    def ns_of(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name) and node.id in self.namespaces and node.id not in self.shadowed:
            return self.namespaces[node.id]
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in self.modules
                and node.value.id not in self.shadowed):
            return node.attr
        return None

    def address(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name) and node.id in self.functions and node.id not in self.shadowed:
            return self.functions[node.id]
        if isinstance(node, ast.Attribute):
            ns = self.ns_of(node.value)
            if ns is not None:
                return f"{ns}.{node.attr}"
        return None


def _direct_targets(stmt: ast.AST) -> Iterable[int]:
    """Ids of the names a simple assignment binds directly (``x = ...``, ``a, *b = ...``)."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]  # type: ignore[attr-defined]
    for target in targets:
        for elt in target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]:
            elt = elt.value if isinstance(elt, ast.Starred) else elt
            if isinstance(elt, ast.Name):
                yield id(elt)
