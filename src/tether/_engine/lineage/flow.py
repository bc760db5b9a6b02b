"""The static data-flow pass: which earlier calls' results may reach each argument of each tool call (D-63).

A program is fixed before it runs, so its data flow can be read from its syntax tree before any tool
answers. The pass is conservative and flow-insensitive: a name that ever holds a value derived from a
tool's result is taken to hold it everywhere, in every branch, before and after — except a module name
assigned only by top-level statements and read only in program order, which gets one variable per
assignment (names.py, ``Scopes.straight``). What it follows:
names (per scope, with ``global``, ``nonlocal`` and closures), attributes, subscripts and slices (the
index too), f-strings, operators, comprehensions and generator expressions, ``for`` targets, ``with``
targets, augmented assignment, the walrus, tuple unpacking (element by element for ``a, b = x, y`` and
``a, b = await asyncio.gather(f(), g())``), calls to the program's own functions (each argument to its
parameter, each ``return`` to the call), lambdas and functions passed to ``map``/``sorted``/..., methods
that store their arguments in their object (``lst.append(x)``, ``d.update(x)``, any method it does not
know) and mutation through every alias of an object (``b = a; b.append(x)`` reaches ``a``). A tool call's
result depends on the tool and on the call's arguments. An exception caught with ``as e`` may hold any
result.

What it does not follow, by design: implicit flows (a value chosen by a branch on untrusted data, a
comprehension's ``if``, a loop's count) — docs/security.md states this limit. What it cannot name (a tool
chosen by data, ``getattr(tools.ns, name)``, ``tools`` passed around, a program it cannot parse, one past
the caps) makes every argument "cannot tell" (``None``), which the judge counts as dependent.

A function's result is what its ``return``s may hold (explicit flows), not every argument it was given: what
its body computes from an argument without returning it is an implicit flow. ``globals()``, ``vars()``,
``eval()`` and their kind reach any variable, so what they give cannot be told.

Bounded: the program text, its syntax-tree nodes, nesting depth, the number of distinct tools and the edges
followed while propagating are capped; past a cap the all-``None`` flow is returned. The graph has a bounded
number of nodes and edges per syntax node (starred arguments, callbacks and defaults reach a function's
parameters through one node; a name defined more than ``MAX_DEFS`` times is called unresolved), and the
propagation is a worklist over bit sets, one bit per tool.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from tether._engine.lineage.names import COMPREHENSIONS, Bail, Scope, Scopes, ToolNames
from tether._engine.lineage.values import marks, normalise

# The program size cap is code_bytes' own default (64 KiB, rules/limits.py) four times over: a program past it
# is not parsed at all.
MAX_CODE_CHARS = 262_144
# Syntax-tree nodes walked: ~3 per 10 bytes of dense code, so 64 KiB of program fits with room to spare.
MAX_NODES = 100_000
# Nesting of expressions and statements walked by recursion; operator chains (a + b + c ...) are flattened
# and do not count. Deeper than this is not a program a model writes.
MAX_DEPTH = 150
# Distinct tools a program names: the propagation costs one bit per tool, and a run makes at most 50 calls by
# default (rules/limits.py).
MAX_TOOLS = 256
# Edges followed while propagating: each bit crosses each edge at most once, so a program of MAX_NODES nodes and
# a few tools stays far below; a program shaped to make every tool's bit walk the same long tail stops here.
MAX_STEPS = 2_000_000
# Functions of one name a call is linked to directly; more (a name redefined over and over) would make calls
# times definitions edges, so past this the call is unresolved and the definitions escaped (linear).
MAX_DEFS = 8
# Program literals kept for the judge (each string's marks and its normalised whole).
MAX_LITERALS = 4_096
_CACHE_SIZE = 128

_SPREAD = -1  # a parameter target meaning "any parameter" (starred arguments)
_ANY = 1  # bit 0: "any result" (a dynamic tool call, a caught exception)

# Methods of str, bytes, dict, list, set and tuple that only read their object: the result depends on the
# object and the arguments, and the object is not changed by the arguments.
_PURE_METHODS = frozenset(
    "capitalize casefold center count decode encode endswith expandtabs find format format_map index isalnum "
    "isalpha isascii isdecimal isdigit isidentifier islower isnumeric isprintable isspace istitle isupper join "
    "ljust lower lstrip partition removeprefix removesuffix replace rfind rindex rjust rpartition rsplit rstrip "
    "split splitlines startswith strip swapcase title translate upper zfill hex fromhex get keys values items "
    "copy isdisjoint issubset issuperset union intersection difference symmetric_difference pop popitem "
    "strftime isoformat date time timestamp weekday isoweekday total_seconds group groups groupdict span "
    "start end findall finditer match search fullmatch sub subn most_common elements hexdigest digest "
    "as_integer_ratio is_integer bit_length to_bytes conjugate".split()
)
# Functions of the sandbox's modules (tools/prompt.py) that store their later arguments in their first.
_STORES_IN_FIRST = frozenset({"heappush", "heappushpop", "heapreplace", "insort", "insort_left", "insort_right"})
# Built-ins that reach variables by name at run time.
_REFLECTIVE = frozenset({"globals", "locals", "vars", "eval", "exec", "compile", "__import__", "dir"})
# Methods that call a function they are given (``lst.sort(key=f)``) and keep no hold of it.
_CALLS_BACK = frozenset({"sort"})
# Python's built-ins and the sandbox's own (tools/stubs.py PRELUDE): none runs the program's code later.
_BUILTINS = frozenset(dir(builtins)) | {"search", "describe", "sources", "emit", "yield_control", "wait_for",
                                        "wait_for_signal"}


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: its maps are not hashable
class DataFlow:
    """Which tools' results may reach which arguments of which tool's calls in one program."""

    literals: frozenset[str] = frozenset()  # the program's own literals, normalised as values.marks does
    parsed: bool = False  # False: nothing could be read; every argument is "cannot tell"
    dynamic: bool = False  # a tool the pass cannot name is called: every argument is "cannot tell"
    addresses: frozenset[str] = frozenset()  # tools the program calls by name
    _named: Mapping[tuple[str, str | int], frozenset[str] | None] = field(
        default_factory=lambda: MappingProxyType({}), repr=False)
    _rest: Mapping[str, frozenset[str] | None] = field(default_factory=lambda: MappingProxyType({}), repr=False)

    def sources_of(self, address: str, arg: str | int) -> frozenset[str] | None:
        """Tool addresses whose results may reach argument ``arg`` (keyword name, or positional index) at any
        call site of ``address``; ``None``: cannot tell (counts as dependent on every earlier result)."""
        if not self.parsed or self.dynamic or address not in self.addresses:
            return None
        named = self._named.get((address, arg), frozenset())
        rest = self._rest.get(address, frozenset())
        if named is None or rest is None:
            return None
        return named | rest

    def sources_for(self, address: str, name: str, positional: Sequence[str] = ()) -> frozenset[str] | None:
        """:meth:`sources_of` for a bound argument ``name``, passed by keyword or at its position in
        ``positional`` (the tool's positional order, ``tools.params.parameters(tool).positional``)."""
        by_name = self.sources_of(address, name)
        if by_name is None or name not in positional:
            return by_name
        by_position = self.sources_of(address, list(positional).index(name))
        return None if by_position is None else by_name | by_position


UNKNOWN = DataFlow()


def analyse(code: str) -> DataFlow:
    """The flow of ``code``; never raises. Unparsable text, or text past a cap, gives the all-``None`` flow."""
    if not isinstance(code, str) or len(code) > MAX_CODE_CHARS:
        return UNKNOWN
    key = hashlib.blake2b(code.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    try:
        flow = _analyse(code)
    except (Bail, RecursionError, MemoryError, SyntaxError, ValueError, TypeError):
        flow = UNKNOWN
    except Exception:  # a fault in the pass must cost a person's look (None asks), never the run
        flow = UNKNOWN
    with _LOCK:  # callers may run on the host-work threads
        _CACHE[key] = flow
        if len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return flow


_CACHE: OrderedDict[bytes, DataFlow] = OrderedDict()
_LOCK = threading.Lock()


def _analyse(code: str) -> DataFlow:
    tree = ast.parse(code)
    tools = ToolNames()
    scopes = Scopes(tree, tools, MAX_NODES)
    tools.aliases()
    graph = _Graph(scopes, tools)
    graph.module(tree)
    return graph.finish()


# -- the graph -------------------------------------------------------------------------------------------------


class _Fn:
    __slots__ = ("node", "params", "vararg", "kwarg", "ret", "escaped", "spread", "merged")

    def __init__(self, node: ast.AST, params: list[int], vararg: int | None, kwarg: int | None, ret: int) -> None:
        self.node = node
        self.params = params  # var nodes of the positional-or-keyword parameters, in order
        self.vararg = vararg
        self.kwarg = kwarg
        self.ret = ret
        self.escaped = False
        self.spread: int | None = None
        self.merged = False

    def all_params(self) -> list[int]:
        return [*self.params, *(x for x in (self.vararg, self.kwarg) if x is not None)]


class _Graph:
    """Nodes are variables and expressions; an edge says "a value here may be found there"."""

    def __init__(self, scopes: Scopes, tools: ToolNames) -> None:
        self.scopes = scopes
        self.tools = tools
        self.succ: list[list[int]] = []
        self.mask: list[int] = []
        self.vars: dict[tuple[int, str, int], int] = {}
        # Module names assigned only by top-level simple statements and read only at the top level: each
        # assignment makes a new variable, so `r = untrusted(); ...; r = trusted()` leaves the second `r` clean.
        self.versioned = scopes.straight
        self.versions: dict[str, int] = {}
        self.bits: dict[str, int] = {}
        self.sites: list[tuple[str, str | int | None, int | None]] = []  # (address, arg or None: every arg, node)
        self.dynamic = bool(tools.star)
        self.strings: list[str] = []
        self.numbers: set[str] = set()
        self.fns: dict[int, _Fn] = {}
        self.parent: dict[int, int] = {}  # union-find over variables that may name one object
        self.mutations: list[tuple[int, int]] = []  # (variable, node stored into its object)
        self.unknown_calls: list[tuple[int, list[int], list[int]]] = []  # (result, argument nodes, their vars)
        self.loaded: list[int] = []  # variables read, for the aliases of an assignment
        self.depth = 0
        self.callback_ok: set[int] = set()  # ids of Name/Lambda nodes passed straight to a call that calls back
        self.escaped_names: set[tuple[int, str]] = set()  # (scope, name) read as a value somewhere
        self.decoded: dict[int, frozenset[str]] = {}
        self.escaped_param = self.new()
        self.escaped_ret = self.new()

    # -- nodes and edges --

    def new(self, mask: int = 0) -> int:
        self.succ.append([])
        self.mask.append(mask)
        return len(self.mask) - 1

    def edge(self, src: int | None, dst: int) -> None:
        if src is not None and src != dst:
            self.succ[src].append(dst)

    def join(self, nodes: Iterable[int | None]) -> int | None:
        """One node for several: their union (no new node for zero or one)."""
        real = [n for n in nodes if n is not None]
        if not real:
            return None
        if len(real) == 1:
            return real[0]
        out = self.new()
        for n in real:
            self.succ[n].append(out)
        return out

    def var(self, scope: Scope, name: str) -> int:
        owner = self.scopes.resolve(scope, name)
        key = (id(owner.node), name, self.versions.get(name, 0) if owner is self.scopes.module else 0)
        node = self.vars.get(key)
        if node is None:
            node = self.vars[key] = self.new()
        return node

    def stored(self, scope: Scope, name: str) -> int:
        """The variable an assignment to ``name`` writes: a new version of a straight-line module name."""
        if name in self.versioned and self.scopes.resolve(scope, name) is self.scopes.module:
            self.versions[name] = self.versions.get(name, 0) + 1
        return self.var(scope, name)

    def bit(self, address: str) -> int:
        b = self.bits.get(address)
        if b is None:
            if len(self.bits) >= MAX_TOOLS:
                raise Bail
            b = self.bits[address] = 1 << (len(self.bits) + 1)
        return b

    def find(self, v: int) -> int:
        root = v
        while self.parent.get(root, root) != root:
            root = self.parent[root]
        while self.parent.get(v, v) != root:  # path compression
            self.parent[v], v = root, self.parent[v]
        return root

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[ra] = rb

    # -- statements --

    def module(self, tree: ast.Module) -> None:
        self.block(tree.body, self.scopes.module)

    def block(self, body: list[ast.stmt], scope: Scope) -> None:
        for stmt in body:
            self.stmt(stmt, scope)

    def stmt(self, node: ast.stmt, scope: Scope) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Bail
        try:
            self._stmt(node, scope)
        finally:
            self.depth -= 1

    def _stmt(self, node: ast.stmt, scope: Scope) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            fn = self.fns.get(id(node)) or self.function(node, scope)
            self.edge(fn.ret, self.var(scope, node.name))
            for deco in node.decorator_list:
                self.expr(deco, scope)
                fn.escaped = True  # the decorator holds the function and may call it with anything
            if scope.kind == "class":
                fn.escaped = True  # a method: called as obj.m(...), which the pass does not resolve
        elif isinstance(node, ast.ClassDef):
            bases = [self.expr(b, scope) for b in [*node.bases, *(k.value for k in node.keywords)]]
            for deco in node.decorator_list:
                self.expr(deco, scope)
            inner = self.scopes.of[id(node)]
            self.block(node.body, inner)
            cls = self.var(scope, node.name)
            for b in bases:
                self.edge(b, cls)
            for name in inner.locals:
                self.edge(self.var(inner, name), cls)
            self.edge(self.escaped_ret, cls)
        elif isinstance(node, ast.Return):
            if node.value is not None:
                mark = len(self.loaded)
                value = self.expr(node.value, scope)
                aliases = self.aliases(node.value, mark)
                owner = self.fns.get(id(scope.node))
                if owner is not None:
                    self.edge(value, owner.ret)
                    for a in aliases:
                        self.union(a, owner.ret)  # `y = f(); y.append(v)` reaches what f returned
        elif isinstance(node, ast.Assign):
            if id(node) in self.tools.alias_nodes:
                return  # `mail = tools.mail`: a name for a namespace, not data
            if self.pairwise(node.targets, node.value, scope):
                return
            mark = len(self.loaded)
            value = self.expr(node.value, scope)
            aliases = self.aliases(node.value, mark)
            for target in node.targets:
                self.assign(target, value, aliases, scope)
        elif isinstance(node, ast.AugAssign):
            value = self.expr(node.value, scope)
            if isinstance(node.target, ast.Name):
                old = self.var(scope, node.target.id)
                new = self.stored(scope, node.target.id)
                self.edge(old, new)
                self.edge(value, new)
            else:
                self.expr(node.target, scope)
                self.assign(node.target, value, [], scope)
        elif isinstance(node, ast.AnnAssign):
            if node.value is not None:
                mark = len(self.loaded)
                value = self.expr(node.value, scope)
                self.assign(node.target, value, self.aliases(node.value, mark), scope)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            mark = len(self.loaded)
            value = self.expr(node.iter, scope)
            self.assign(node.target, value, self.aliases(node.iter, mark), scope)
            self.block(node.body, scope)
            self.block(node.orelse, scope)
        elif isinstance(node, (ast.While, ast.If)):
            self.expr(node.test, scope)  # evaluated for the calls it makes; a branch's choice is not data here
            self.block(node.body, scope)
            self.block(node.orelse, scope)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                mark = len(self.loaded)
                value = self.expr(item.context_expr, scope)
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, value, self.aliases(item.context_expr, mark), scope)
            self.block(node.body, scope)
        elif isinstance(node, (ast.Try, ast.TryStar)):
            self.block(node.body, scope)
            for handler in node.handlers:
                if handler.type is not None:
                    self.expr(handler.type, scope)
                if handler.name:
                    # An error's message may quote any result: "cannot tell".
                    self.edge(self.new(_ANY), self.var(scope, handler.name))
                self.block(handler.body, scope)
            self.block(node.orelse, scope)
            self.block(node.finalbody, scope)
        elif isinstance(node, ast.Match):
            subject = self.expr(node.subject, scope)
            for case in node.cases:
                for sub in ast.walk(case.pattern):
                    if isinstance(sub, (ast.MatchAs, ast.MatchStar)) and sub.name:
                        self.edge(subject, self.var(scope, sub.name))
                    elif isinstance(sub, ast.MatchMapping) and sub.rest:
                        self.edge(subject, self.var(scope, sub.rest))
                    elif isinstance(sub, ast.MatchValue):
                        self.expr(sub.value, scope)
                if case.guard is not None:
                    self.expr(case.guard, scope)
                self.block(case.body, scope)
        elif isinstance(node, (ast.Expr, ast.Raise, ast.Assert, ast.Delete)):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child, scope)
        elif isinstance(node, (ast.Import, ast.ImportFrom, ast.Global, ast.Nonlocal, ast.Pass, ast.Break,
                               ast.Continue)):
            return
        else:
            # A statement this Python knows and the pass does not: every expression in it is still read.
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child, scope)
                elif isinstance(child, ast.stmt):
                    self.stmt(child, scope)

    def function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda, scope: Scope) -> _Fn:
        inner = self.scopes.of[id(node)]
        args = node.args
        positional = [*args.posonlyargs, *args.args]
        params = [self.var(inner, a.arg) for a in positional]
        vararg = self.var(inner, args.vararg.arg) if args.vararg is not None else None
        kwarg = self.var(inner, args.kwarg.arg) if args.kwarg is not None else None
        fn = _Fn(node, params, vararg, kwarg, self.new())
        fn.params += [self.var(inner, a.arg) for a in args.kwonlyargs]
        self.fns[id(node)] = fn
        # Defaults are evaluated in the enclosing scope and may land in any parameter that has one.
        defaults = [self.expr(d, scope) for d in [*args.defaults, *(d for d in args.kw_defaults if d is not None)]]
        joined = self.join(defaults)
        if joined is not None:
            self.edge(joined, self.spread(fn))
        if isinstance(node, ast.Lambda):
            self.edge(self.expr(node.body, inner), fn.ret)
        else:
            self.block(node.body, inner)
        return fn

    def pairwise(self, targets: list[ast.expr], value: ast.expr, scope: Scope) -> bool:
        """``a, b = x, y`` and ``a, b = await asyncio.gather(f(), g())``: each target from its own element."""
        if len(targets) != 1 or not isinstance(targets[0], (ast.Tuple, ast.List)):
            return False
        elts = targets[0].elts
        inner = value.value if isinstance(value, ast.Await) else value
        if isinstance(inner, (ast.Tuple, ast.List)) and not isinstance(value, ast.Await):
            items = inner.elts
        elif (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "gather"
              and isinstance(inner.func.value, ast.Name) and not inner.keywords
              and (id(self.scopes.module.node), inner.func.value.id) in self.scopes.imported):
            items = inner.args
        else:
            return False
        if len(items) != len(elts) or any(isinstance(e, ast.Starred) for e in [*items, *elts]):
            return False
        values = []
        for item in items:  # every element read before any target is written (`a, b = b, a`)
            mark = len(self.loaded)
            values.append((self.expr(item, scope), self.aliases(item, mark)))
        for target, (node, aliases) in zip(elts, values):
            self.assign(target, node, aliases, scope)
        return True

    def aliases(self, value: ast.expr, mark: int) -> list[int]:
        """The variables an assigned value may be the very object of (a new string or number is none)."""
        taken = self.loaded[mark:]
        del self.loaded[mark:]
        if isinstance(value, (ast.Constant, ast.JoinedStr, ast.Compare, ast.BinOp, ast.UnaryOp)):
            return []
        return taken

    def assign(self, target: ast.AST, value: int | None, aliases: list[int], scope: Scope) -> None:
        if isinstance(target, ast.Name):
            v = self.stored(scope, target.id)
            self.edge(value, v)
            for a in aliases:
                self.union(a, v)
        elif isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self.assign(elt, value, aliases, scope)
        elif isinstance(target, ast.Starred):
            self.assign(target.value, value, aliases, scope)
        elif isinstance(target, (ast.Attribute, ast.Subscript)):
            # `x.f = v`, `x[k] = v`: v is now inside x's object, whichever names it.
            stored = value
            if isinstance(target, ast.Subscript):
                stored = self.join([value, self.expr(target.slice, scope)])
            for root in self.roots(target.value, scope):
                if stored is not None:
                    self.mutations.append((root, stored))
                for a in aliases:
                    self.union(a, root)

    def roots(self, node: ast.expr, scope: Scope) -> list[int]:
        """The variables whose object an expression like ``a.b[c]`` is part of."""
        while isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
            node = node.value
        if isinstance(node, ast.Name):
            return [self.var(scope, node.id)]
        mark = len(self.loaded)
        self.expr(node, scope)
        taken = self.loaded[mark:]
        del self.loaded[mark:]
        return taken

    # -- expressions --

    def expr(self, node: ast.expr, scope: Scope) -> int | None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Bail
        try:
            return self._expr(node, scope)
        finally:
            self.depth -= 1

    def _expr(self, node: ast.expr, scope: Scope) -> int | None:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                self.strings.append(node.value)
            elif isinstance(node.value, int) and not isinstance(node.value, bool):
                if -10**40 < node.value < 10**40:
                    self.numbers.add(str(node.value))
            elif isinstance(node.value, bytes):
                self.strings.append(node.value.decode("utf-8", "ignore"))
            return None
        if isinstance(node, ast.Name):
            if self.tools.bound(node.id) or node.id in self.tools.shadowed:
                self.dynamic = True  # tools, a namespace or a tool used as a value: calls nobody can name
            if id(node) not in self.callback_ok:
                owner = self.scopes.resolve(scope, node.id)
                self.escaped_names.add((id(owner.node), node.id))  # a function read as a value may escape
            v = self.var(scope, node.id)
            self.loaded.append(v)
            return v
        if isinstance(node, ast.Attribute):
            if self.tools.address(node) is not None or self.tools.ns_of(node) is not None:
                self.dynamic = True
                return None
            return self.expr(node.value, scope)
        if isinstance(node, ast.Call):
            return self.call(node, scope)
        if isinstance(node, ast.BinOp):
            # Left-deep chains (a + b + c + ...) walked in a loop: their length is not nesting.
            parts: list[int | None] = []
            while isinstance(node, ast.BinOp):
                parts.append(self.expr(node.right, scope))
                node = node.left
            parts.append(self.expr(node, scope))
            return self.join(parts)
        if isinstance(node, ast.IfExp):
            self.expr(node.test, scope)  # a branch's choice is an implicit flow (module docstring)
            return self.join([self.expr(node.body, scope), self.expr(node.orelse, scope)])
        if isinstance(node, ast.NamedExpr):
            mark = len(self.loaded)
            value = self.expr(node.value, scope)
            aliases = self.aliases(node.value, mark)
            self.assign(node.target, value, aliases, scope)
            self.loaded.extend(aliases)
            return value
        if isinstance(node, ast.Lambda):
            fn = self.function(node, scope)
            fn.escaped = id(node) not in self.callback_ok
            return fn.ret
        if isinstance(node, COMPREHENSIONS):
            return self.comprehension(node, scope)
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            value = self.expr(node.value, scope) if node.value is not None else None
            holder = self.fns.get(id(scope.node))
            if holder is not None:
                self.edge(value, holder.ret)
            return None
        # Everything else (subscripts, slices, f-strings, operators, displays, await, starred): the union of
        # its parts.
        return self.join([self.expr(child, scope) for child in ast.iter_child_nodes(node) if isinstance(child, ast.expr)])

    def comprehension(self, node: ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp,
                      scope: Scope) -> int | None:
        inner = self.scopes.of[id(node)]
        for i, gen in enumerate(node.generators):
            mark = len(self.loaded)
            # The first iterable is evaluated where the comprehension stands.
            value = self.expr(gen.iter, scope if i == 0 else inner)
            self.assign(gen.target, value, self.aliases(gen.iter, mark), inner)
            for cond in gen.ifs:
                self.expr(cond, inner)
        if isinstance(node, ast.DictComp):
            return self.join([self.expr(node.key, inner), self.expr(node.value, inner)])
        return self.expr(node.elt, inner)

    def call(self, node: ast.Call, scope: Scope) -> int | None:
        address = self.tools.address(node.func)
        if address is not None:
            return self.tool_call(address, node, scope)
        fns = self.direct_defs(node.func, scope)
        if fns is not None:
            return self.user_call(fns, node, scope)
        kind = self.callee_kind(node.func, scope)
        method = node.func.attr if isinstance(node.func, ast.Attribute) else ""
        mark = len(self.loaded)
        callee = self.expr(node.func, scope) if kind != "builtin" else None
        if kind == "builtin" and isinstance(node.func, ast.Name) and node.func.id in _REFLECTIVE:
            callee = self.new(_ANY)  # globals()['x'], eval(...): any variable, so any result
        receiver = self.loaded[mark:]
        del self.loaded[mark:]
        given: list[ast.expr] = [*node.args, *(k.value for k in node.keywords)]
        # A function handed to map/sorted/re.sub... is called by it with the other arguments, and returns into
        # the result; handed to anything else it may be called from anywhere (escaped).
        calls_back = kind in ("builtin", "library") or (kind == "method" and method in _CALLS_BACK)
        callbacks: list[_Fn] = []
        nodes: list[int | None] = []
        arg_vars: list[int] = []
        for arg in given:
            inner = arg.value if isinstance(arg, ast.Starred) else arg
            if calls_back and isinstance(inner, (ast.Lambda, ast.Name)):
                self.callback_ok.add(id(inner))
            m = len(self.loaded)
            nodes.append(self.expr(arg, scope))
            arg_vars.extend(self.loaded[m:])
            del self.loaded[m:]
            if calls_back:
                callbacks.extend(self.function_values(inner, scope))
        result = self.join([callee, *nodes])
        everything = self.join(nodes) if callbacks else None
        for fn in callbacks:
            if result is None:
                result = self.new()
            self.edge(fn.ret, result)
            if everything is not None:
                self.edge(everything, self.spread(fn))
        stores_in_first = (kind == "builtin" and isinstance(node.func, ast.Name) and node.func.id == "setattr") or (
            kind == "library" and method in _STORES_IN_FIRST)
        if stores_in_first and len(given) >= 2:
            # setattr(obj, name, v), heapq.heappush(h, v), bisect.insort(a, v): v is now inside the first argument.
            stored = self.join(nodes[1:])
            for root in self.roots(given[0], scope):
                if stored is not None:
                    self.mutations.append((root, stored))
                for v in arg_vars:
                    self.union(v, root)
        if kind == "method" and method not in _PURE_METHODS:
            # `lst.append(x)`, `d.update(x)`, an unknown method: the arguments may now be inside the object.
            stored = self.join(nodes)
            base = node.func.value if isinstance(node.func, ast.Attribute) else node.func
            while isinstance(base, (ast.Attribute, ast.Subscript)):
                base = base.value
            roots = [self.var(scope, base.id)] if isinstance(base, ast.Name) else receiver
            for root in roots:
                if stored is not None:
                    self.mutations.append((root, stored))
                for v in arg_vars:
                    self.union(v, root)
        if kind == "unknown" or (kind == "method" and method not in _PURE_METHODS):
            if result is None:
                result = self.new()
            self.unknown_calls.append((result, [n for n in nodes if n is not None], arg_vars + receiver))
        self.loaded.extend(receiver)
        self.loaded.extend(arg_vars)
        return result

    def tool_call(self, address: str, node: ast.Call, scope: Scope) -> int:
        result = self.new(self.bit(address))
        starred = False
        for i, arg in enumerate(node.args):
            if isinstance(arg, ast.Starred):
                starred = True
            n = self.expr(arg, scope)
            self.sites.append((address, None if starred else i, n))
            self.edge(n, result)
        for kw in node.keywords:
            n = self.expr(kw.value, scope)
            self.sites.append((address, kw.arg, n))  # `**d`: kw.arg is None, every argument
            self.edge(n, result)
        if not node.args and not node.keywords:
            self.sites.append((address, "", None))
        return result

    def user_call(self, fns: list[_Fn], node: ast.Call, scope: Scope) -> int | None:
        result = self.new()
        for fn in fns:
            self.edge(fn.ret, result)
        given: list[int] = []  # the variables the arguments may be, which the result may be too
        starred = False
        for i, arg in enumerate(node.args):
            starred = starred or isinstance(arg, ast.Starred)
            for fn, targets in self.passed(fns, arg, scope, given):
                if starred:
                    targets.append(_SPREAD)
                elif i < len(fn.params) and i < _positional_count(fn.node):
                    targets.append(fn.params[i])
                elif fn.vararg is not None:
                    targets.append(fn.vararg)
        for kw in node.keywords:
            for fn, targets in self.passed(fns, kw.value, scope, given):
                names = _param_names(fn.node)
                if kw.arg is None:
                    targets.append(_SPREAD)
                elif kw.arg in names:
                    targets.append(fn.params[names.index(kw.arg)])
                elif fn.kwarg is not None:
                    targets.append(fn.kwarg)
        self.loaded.extend(given)
        self.loaded.extend(fn.ret for fn in fns)  # the result may be whatever the function returns
        return result

    def passed(self, fns: list[_Fn], arg: ast.expr, scope: Scope, given: list[int]) -> Iterator[tuple[_Fn, list[int]]]:
        """Evaluates one argument; yields each function with a list to fill with the parameters it lands in."""
        mark = len(self.loaded)
        n = self.expr(arg, scope)
        aliases = self.aliases(arg, mark)
        given += aliases
        for fn in fns:
            targets: list[int] = []
            yield fn, targets
            for t in targets:
                if t == _SPREAD:  # `*args` / `**kwargs`: any parameter, through one node each way
                    self.edge(n, self.spread(fn))
                    one = self.merged(fn)
                    if one is not None:
                        for a in aliases:
                            self.union(a, one)
                    continue
                self.edge(n, t)
                for a in aliases:
                    self.union(a, t)

    def spread(self, fn: _Fn) -> int:
        """One node that reaches every parameter of ``fn`` (made once: linear however many callers spread)."""
        if fn.spread is None:
            fn.spread = self.new()
            self.succ[fn.spread].extend(fn.all_params())
        return fn.spread

    def merged(self, fn: _Fn) -> int | None:
        """A parameter of ``fn`` in one alias class with all the others, for a value that may be any of them."""
        params = fn.all_params()
        if not params:
            return None
        if not fn.merged:
            for p in params[1:]:
                self.union(params[0], p)
            fn.merged = True
        return params[0]

    def direct_defs(self, func: ast.expr, scope: Scope) -> list[_Fn] | None:
        """The program's own functions a callee names, when the name is bound by ``def`` only."""
        if not isinstance(func, ast.Name):
            return None
        owner = self.scopes.resolve(scope, func.id)
        key = (id(owner.node), func.id)
        defs = self.scopes.defs.get(key)
        if not defs or key in self.scopes.other or key in self.scopes.imported or len(defs) > MAX_DEFS:
            return None  # past MAX_DEFS: an unresolved call, through the escaped functions' hubs
        if any(isinstance(d, ast.ClassDef) for d in defs):
            return None
        fns = [self.fns.get(id(d)) for d in defs]
        if any(f is None for f in fns):
            # Called before its def was walked (a helper defined below its caller): walk it now.
            for d in defs:
                if id(d) not in self.fns and isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.function(d, owner)
            fns = [self.fns.get(id(d)) for d in defs]
        return [f for f in fns if f is not None]

    def function_values(self, arg: ast.expr, scope: Scope) -> list[_Fn]:
        """The program's functions an argument is: a lambda written there, or a name bound by ``def`` only."""
        if isinstance(arg, ast.Lambda):
            fn = self.fns.get(id(arg))
            return [fn] if fn is not None else []
        return self.direct_defs(arg, scope) or [] if isinstance(arg, ast.Name) else []

    def callee_kind(self, func: ast.expr, scope: Scope) -> str:
        if isinstance(func, ast.Name):
            owner = self.scopes.resolve(scope, func.id)
            key = (id(owner.node), func.id)
            if func.id in _BUILTINS and owner is self.scopes.module and func.id not in owner.locals:
                return "builtin"
            if key in self.scopes.imported and key not in self.scopes.other:
                return "library"  # `from json import dumps`
            return "unknown"
        if isinstance(func, ast.Attribute):
            base = func.value
            if isinstance(base, ast.Name):
                owner = self.scopes.resolve(scope, base.id)
                key = (id(owner.node), base.id)
                if key in self.scopes.imported and key not in self.scopes.other:
                    return "library"  # json.dumps, base64.b64encode, asyncio.gather
            return "method"
        return "unknown"

    # -- the end --

    def finish(self) -> DataFlow:
        for key in self.escaped_names:
            for d in self.scopes.defs.get(key, []):
                fn = self.fns.get(id(d))
                if fn is not None:
                    fn.escaped = True
        escaped = [fn for fn in self.fns.values() if fn.escaped]
        if escaped:
            # A function held as a value may be called by any call the pass cannot resolve.
            for fn in escaped:
                for p in fn.all_params():
                    self.edge(self.escaped_param, p)
                    self.union(self.escaped_param, p)
                self.edge(fn.ret, self.escaped_ret)
            for result, nodes, arg_vars in self.unknown_calls:
                self.edge(self.escaped_ret, result)
                for n in nodes:
                    self.edge(n, self.escaped_param)
                for v in arg_vars:
                    self.union(v, self.escaped_param)
        # What is stored into an object reaches every variable that may name it.
        if self.mutations:
            members: dict[int, list[int]] = {}
            for v in self.vars.values():
                members.setdefault(self.find(v), []).append(v)
            members.setdefault(self.find(self.escaped_param), []).append(self.escaped_param)
            hubs: dict[int, int] = {}
            for v, stored in self.mutations:
                root = self.find(v)
                hub = hubs.get(root)
                if hub is None:
                    hub = hubs[root] = self.new()
                    for m in members.get(root, [v]):
                        self.edge(hub, m)
                self.edge(stored, hub)
        self.propagate()
        names = {b: a for a, b in self.bits.items()}
        named: dict[tuple[str, str | int], frozenset[str] | None] = {}
        rest: dict[str, frozenset[str] | None] = {}
        for address, arg, site in self.sites:
            sources = self.sources(site, names)
            if arg is None:
                old = rest.get(address, frozenset())
                rest[address] = None if old is None or sources is None else old | sources
            else:
                was = named.get((address, arg), frozenset())
                named[(address, arg)] = None if was is None or sources is None else was | sources
        return DataFlow(
            literals=self.literal_norms(),
            parsed=True,
            dynamic=self.dynamic,
            addresses=frozenset(a for a, _, _ in self.sites),
            _named=MappingProxyType(named),
            _rest=MappingProxyType(rest),
        )

    def propagate(self) -> None:
        mask, succ = self.mask, self.succ
        # Oldest first: a tool's bit usually flows forward through the program, so it meets the later ones on
        # the way instead of each walking the same tail alone.
        work = [n for n, m in enumerate(mask) if m][::-1]
        budget = MAX_STEPS
        while work:
            n = work.pop()
            m = mask[n]
            edges = succ[n]
            budget -= len(edges)
            if budget < 0:
                raise Bail
            for s in edges:
                if m & ~mask[s]:
                    mask[s] |= m
                    work.append(s)

    def sources(self, node: int | None, names: dict[int, str]) -> frozenset[str] | None:
        if node is None:
            return frozenset()
        m = self.mask[node]
        if m & _ANY:
            return None
        # Sites share few distinct masks: each is decoded once, not once per site and tool.
        hit = self.decoded.get(m)
        if hit is None:
            hit = self.decoded[m] = frozenset(a for b, a in names.items() if m & b)
        return hit

    def literal_norms(self) -> frozenset[str]:
        out: set[str] = set(self.numbers)
        for text in dict.fromkeys(self.strings):
            if len(out) >= MAX_LITERALS:
                break
            whole = normalise(text)
            if whole:
                out.add(whole)
            out.update(m.norm for m in marks(text, limit=64) if m.kind != "text")
        return frozenset(out)


def _positional_count(node: ast.AST) -> int:
    args = node.args  # type: ignore[attr-defined]
    return len(args.posonlyargs) + len(args.args)


def _param_names(node: ast.AST) -> list[str]:
    args = node.args  # type: ignore[attr-defined]
    return [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
