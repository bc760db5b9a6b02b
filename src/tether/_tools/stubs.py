'''Type stubs for the sandbox's checker, generated from the catalog.

Monty runs the bundled ``ty`` checker before a program executes. With these
stubs a call with a missing, unknown or ill-typed argument, an unknown
tool or an unknown namespace is refused with a diagnostic that names the
argument and points at the declaration — before any tool runs.

How to pass a :class:`Stubs` to ``pydantic_monty``
---------------------------------------------------
Three pieces, all verified against the real checker (see
``tests/tools/test_stubs.py::test_checker_*``):

1. ``type_check_stubs=stubs.prelude`` at checkout. It declares the built-ins
   (``search``, ``describe``, ``sources``, ``emit``, ``yield_control``,
   ``wait_for``, ``wait_for_signal``) as if defined in the program itself.
   At run time they are served by ``feed_run(..., external_lookup={...})``
   with host callables of the same name: async callables for the ``async
   def`` ones, a plain callable for ``emit``. Each callable must accept the
   parameter names the prelude declares (e.g. ``search(query, namespace=None,
   limit=12, offset=0)``, ``describe(address)``), since programs may pass
   them by keyword.
2. ``external_modules={"tools": ExternalModule(ns_attrs, stubs=stubs.tools_module)}``
   where ``ns_attrs`` maps each namespace to a nested module:
   ``{ns: ExternalModule({name: async_handler, ...}, stubs=stubs.namespace_modules[ns])}``.
   ``tools_module`` is one ``from . import ns as ns`` line per namespace.
   Without it (a bare package tree) ``ty`` warns
   ``possibly-missing-submodule`` on every ``tools.ns.x`` and the program is
   refused; with it ``import tools``, ``from tools import ns`` and
   ``import tools.ns`` all check.
3. ``type_check=True`` at checkout.

Example::

    stubs = build_stubs(catalog)
    tree = {
        ns: ExternalModule({t.name: handler_for(t) for t in tools_in(ns)},
                           stubs=stubs.namespace_modules[ns])
        for ns in stubs.namespace_modules
    }
    async with pool.checkout(
        type_check=True,
        type_check_stubs=stubs.prelude,
        external_modules={"tools": ExternalModule(tree, stubs=stubs.tools_module)},
    ) as session:
        await session.feed_run(code, external_lookup={"search": search_fn, ...})

    # code = 'import tools\\nawait tools.tracker.create_ticket(titel="x")'
    # -> MontyTypingError:
    #    error[missing-argument]: No argument provided for required parameter
    #        `title` of function `create_ticket`
    #    error[unknown-argument]: Argument `titel` does not match any known
    #        parameter of function `create_ticket`

Only namespaces and tools a program can reach are declared: a name that is a
Python keyword (``tools.ns.import``) cannot be written as an attribute, and
``ExternalModule`` hides names starting with ``_``.

JSON Schema → Python: string/integer/number/boolean/null → str/int/float/
bool/None; enum/const → ``Literal``; anyOf/oneOf/type lists → unions;
``$ref`` into ``$defs``/``definitions`` → the named class; an object with
properties → a ``TypedDict`` (optional keys ``NotRequired``); an object
without → ``dict[str, V]``; anything else → ``Any``. A class is named from the
schema — its title or definition name (``SimpleUser``), else where it sits
(``PullRequestSimple_head``) — and equal shapes share one class;
:func:`declaration` renders one tool alone for ``describe()`` (D-21).

Argument types are loosened where ``ty``'s inference would refuse correct
programs: arrays are ``Sequence[T]`` (``list`` is invariant, so a
``list[int]`` variable would not pass as ``list[float]``) and an object is
``TheTypedDict | Mapping[str, Any]`` (a dict built in a variable is inferred
as ``dict[str, str]``, never as the TypedDict). The TypedDict still documents
the keys in ``describe()``; the host validates them at call time. Return types
are exact, so reading an undeclared key of a result is refused.
'''

from __future__ import annotations

import collections
import functools
import json
import keyword
import math
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from tether._tools.catalog import Catalog, accepts_extra_args
from tether._tools.model import Tool
from tether._tools.params import parameters

PRELUDE = '''\
from typing import Any, Literal, NotRequired, TypedDict

class _ToolSummary(TypedDict):
    address: str
    title: str | None
    description: str
    annotations: dict[str, bool]
    score: float

class _SearchResult(TypedDict):
    results: list[_ToolSummary]
    total: int
    next_offset: int | None

class _ToolDescription(TypedDict):
    address: str
    signature: NotRequired[str]
    types: NotRequired[str]
    description: NotRequired[str]
    annotations: NotRequired[dict[str, bool]]
    input_schema: NotRequired[dict[str, Any]]
    section: NotRequired[str]
    offset: NotRequired[int]
    next_offset: NotRequired[int | None]
    note: NotRequired[str]
    error: NotRequired[str]
    suggestions: NotRequired[list[str]]

class _Source(TypedDict):
    namespace: str
    tools: int
    summary: str

async def search(query: str = "", namespace: str | None = None, limit: int = 12, offset: int = 0) -> _SearchResult: ...
async def describe(address: str | list[str], detail: Literal["default", "full", "input_schema", "types", "description"] = "default", offset: int = 0) -> list[_ToolDescription]: ...
async def sources() -> list[_Source]: ...
def emit(value: Any) -> None: ...
async def yield_control() -> None: ...
async def wait_for(name: str, timeout: float | None = None) -> Any: ...
async def wait_for_signal(name: str) -> Any: ...
''' + (
    # Names the sandbox has at run time but the bundled checker's builtins
    # lack (tests/tools/test_check.py probes both, so a new release cannot
    # drift): without these, `except PermissionError` — what a declined write
    # raises — would be refused by the check.
    "class ImportError(Exception): ...\n"
    "class ModuleNotFoundError(ImportError): ...\n"
    "class FileExistsError(OSError): ...\n"
    "class FileNotFoundError(OSError): ...\n"
    "class IsADirectoryError(OSError): ...\n"
    "class NotADirectoryError(OSError): ...\n"
    "class PermissionError(OSError): ...\n"
    "class UnboundLocalError(NameError): ...\n"
    "class UnicodeDecodeError(ValueError): ...\n"
    "class UnicodeEncodeError(ValueError): ...\n"
    "def filter(function: Any, iterable: Any, /) -> Any: ...\n"
    "def format(value: Any, format_spec: str = '', /) -> str: ...\n"
    "def getattr(o: Any, name: str, default: Any = ..., /) -> Any: ...\n"
    "def hasattr(o: Any, name: str, /) -> bool: ...\n"
    "def issubclass(cls: Any, class_or_tuple: Any, /) -> bool: ...\n"
    "def map(function: Any, *iterables: Any) -> Any: ...\n"
    "def open(*args: Any, **kwargs: Any) -> Any: ...\n"
    "def setattr(o: Any, name: str, value: Any, /) -> None: ...\n"
)

# Names the generated text spells; a tool of the same name would shadow them
# in its module, so they are then imported under an alias.
_BUILTIN_NAMES = ("str", "int", "float", "bool", "list", "dict")
_TYPING_NAMES = ("Any", "Literal", "NotRequired", "TypedDict")
_ABC_NAMES = ("Mapping", "Sequence")

# Deeper schemas than this are data, not argument shapes; Any keeps them cheap.
_MAX_DEPTH = 12
# Defaults longer than this are shown as ``...``: the signature is for reading.
_MAX_DEFAULT_CHARS = 40

_MISSING = object()


@dataclass(frozen=True)
class ToolStub:
    """One tool's declaration as ``describe()`` shows it."""

    signature: str  # "async def tools.ns.name(a: int, *, b: str = ...) -> Ret"
    types: str  # the class definitions the signature refers to, or ""


@dataclass(frozen=True)
class Stubs:
    """Everything the sandbox adapter passes to Monty; see the module docstring."""

    prelude: str  # checkout(type_check_stubs=...)
    tools_module: str  # ExternalModule(..., stubs=...) of the "tools" module
    namespace_modules: Mapping[str, str]  # namespace -> stubs of its nested ExternalModule
    tool_stubs: Mapping[str, ToolStub] = field(repr=False)  # address -> declaration
    version: int = 0  # the catalog version these were built from


def build_stubs(catalog: Catalog) -> Stubs:
    """The stubs for ``catalog``, cached until the catalog changes."""
    return catalog.memo("stubs", lambda: _build(catalog))


def render_signature(tool: Tool) -> str:
    """``async def tools.ns.name(...) -> ...`` for one tool on its own."""
    module = _Module([tool.name])
    return module.add_tool(tool).signature


def declaration(tool: Tool) -> tuple[str, list[tuple[str, str]]]:
    """One tool's signature and its shapes ``[(class name, class text)]``, nearest first.

    Rendered from the tool alone, so the names depend on its own schema and
    on nothing else in the catalog: the same text in every process and as
    the catalog grows. The order is breadth-first from the signature: the
    shapes it names, then the shapes those name.
    """
    module = _Module([tool.name])
    signature = module.add_tool(tool).signature
    # Linear in the shapes (a set and a deque): a tool with 40,000 of them took 40 s with a list for both.
    order: dict[str, None] = {}
    queue = collections.deque(module.roots)
    while queue:
        name = queue.popleft()
        if name not in order:
            order[name] = None
            queue.extend(module.class_deps.get(name, ()))
    return signature, [(name, module.classes[name].rstrip("\n")) for name in order]


def callable_name(name: str) -> bool:
    """Whether ``name`` can be written as an attribute in a program."""
    return name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_")


def stubs_for(catalog: Catalog, addresses: Iterable[str] = (), namespaces: Iterable[str] = (),
              everything: bool = False) -> Stubs:
    """Stubs for only what a program reaches (see tools.precheck): the check costs O(program), not O(catalog).

    ``addresses`` are the tools it names, ``namespaces`` those it reaches
    dynamically (all their tools); ``everything`` gives the whole catalog's.
    Cached per catalog version and reach.
    """
    if everything:
        return build_stubs(catalog)
    key = ("stubs-for", frozenset(addresses), frozenset(namespaces))
    cache: dict[tuple[str, frozenset[str], frozenset[str]], Stubs] = catalog.memo("stubs-for", dict)
    hit = cache.get(key)
    if hit is not None:
        return hit
    wanted_ns = set(namespaces)
    picked: dict[str, Tool] = {}
    for address in key[1]:
        if address in catalog:
            tool = catalog.get(address)
            picked[tool.address] = tool
    if wanted_ns:
        for tool in catalog.tools():
            if tool.namespace in wanted_ns:
                picked[tool.address] = tool
    stubs = _build(catalog, sorted(picked.values(), key=lambda t: t.address))
    if len(cache) > 512:
        cache.clear()
    cache[key] = stubs
    return stubs


def _build(catalog: Catalog, tools: Iterable[Tool] | None = None) -> Stubs:
    by_ns: dict[str, list[Tool]] = {}
    for tool in catalog.tools() if tools is None else tools:
        if callable_name(tool.namespace) and callable_name(tool.name):
            by_ns.setdefault(tool.namespace, []).append(tool)
    modules: dict[str, str] = {}
    per_tool: dict[str, ToolStub] = {}
    for ns, tools in by_ns.items():
        module = _Module(t.name for t in tools)
        for tool in tools:
            per_tool[tool.address] = module.add_tool(tool)
        modules[ns] = module.text()
    tools_module = "".join(f"from . import {ns} as {ns}\n" for ns in modules)
    return Stubs(
        prelude=PRELUDE,
        tools_module=tools_module,
        namespace_modules=MappingProxyType(modules),
        tool_stubs=MappingProxyType(per_tool),
        version=catalog.version,
    )


@functools.lru_cache(maxsize=4096)
def _camel(text: str) -> str:
    parts = re.split(r"[^0-9A-Za-z]+", text)
    name = "".join(p[:1].upper() + p[1:] for p in parts if p)
    if not name or name[0].isdigit():
        name = "T" + name
    return name + "_" if keyword.iskeyword(name) else name


@functools.lru_cache(maxsize=4096)
def _field(key: str) -> str:
    """A property name as it appears in a class name: ``PullRequest_user``."""
    return re.sub(r"[^0-9A-Za-z]+", "_", key).strip("_") or "field"


def _literal(value: Any) -> str | None:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        # JSON string escapes are all valid Python escapes.
        return json.dumps(value, ensure_ascii=False)
    return None


def _canon(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


class _Root:
    """One tool schema being rendered: where its ``$ref``s point."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self._defs_key: str | None = None

    @property
    def defs_key(self) -> str:
        if self._defs_key is None:
            defs = self.schema.get("$defs") or self.schema.get("definitions") if isinstance(self.schema, dict) else None
            self._defs_key = _canon(defs) if defs else ""
        return self._defs_key

    def resolve(self, ref: str) -> tuple[str, Any] | None:
        if not ref.startswith("#"):
            return None
        node: Any = self.schema
        parts = [p.replace("~1", "/").replace("~0", "~") for p in ref[1:].split("/") if p]
        for part in parts:
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return None
        return (parts[-1] if parts else "Root"), node


class _Module:
    """The stub text of one namespace module, built tool by tool."""

    def __init__(self, tool_names: Iterable[str]) -> None:
        names = set(tool_names)
        self.taken = names | set(_BUILTIN_NAMES) | set(_TYPING_NAMES) | set(_ABC_NAMES)
        # How this module spells each name it uses: aliased where a tool shadows it.
        self.n = {k: (f"_{k}" if k in names else k) for k in (*_BUILTIN_NAMES, *_TYPING_NAMES, *_ABC_NAMES)}
        self.classes: dict[str, str] = {}
        self.class_deps: dict[str, dict[str, None]] = {}
        self.functions: list[str] = []
        self.roots: list[str] = []  # the classes the last tool's signature names, in order
        self._by_key: dict[tuple[str, str, str], str] = {}
        # Class references of what is being rendered, in the order met (dicts as
        # ordered sets: describe() lists shapes in this order, in every process).
        self._refs: list[dict[str, None]] = [{}]
        self._resolving: set[tuple[str, str]] = set()

    # --- output --------------------------------------------------------------

    def text(self) -> str:
        header = []
        aliased = [k for k in _BUILTIN_NAMES if self.n[k] != k]
        if aliased:
            header.append("from builtins import " + ", ".join(f"{k} as {self.n[k]}" for k in aliased))
        header.append("from collections.abc import " + ", ".join(self._import(k) for k in _ABC_NAMES))
        header.append("from typing import " + ", ".join(self._import(k) for k in _TYPING_NAMES))
        return "\n".join(header) + "\n\n" + "".join(self.classes.values()) + "".join(self.functions)

    def _import(self, name: str) -> str:
        return name if self.n[name] == name else f"{name} as {self.n[name]}"

    def add_tool(self, tool: Tool) -> ToolStub:
        self._refs = [{}]
        base = _camel(tool.name)
        params = self._params(tool, base)
        returns = self.n["Any"]
        output_schema = tool.returns_schema()
        if output_schema is not None:
            returns = self._type(output_schema, _Root(output_schema), f"{base}Result", 0, inputs=False)
        self.functions.append(f"async def {tool.name}({params}) -> {returns}: ...\n")
        self.roots = list(self._refs[0])
        used = self._closure(self._refs[0])
        return ToolStub(
            signature=f"async def tools.{tool.namespace}.{tool.name}({params}) -> {returns}",
            types="".join(self.classes[c] for c in self.classes if c in used).rstrip("\n"),
        )

    def _closure(self, roots: Iterable[str]) -> set[str]:
        seen: set[str] = set()
        todo = list(roots)
        while todo:
            name = todo.pop()
            if name not in seen:
                seen.add(name)
                todo.extend(self.class_deps.get(name, ()))
        return seen

    # --- parameters ----------------------------------------------------------

    def _params(self, tool: Tool, base: str) -> str:
        schema = tool.input_schema
        root = _Root(schema)
        props = schema.get("properties") or {}
        if not all(name.isidentifier() and not keyword.iskeyword(name) for name in props):
            # A name like "from" or "user-id" can only be passed as **{...}, and ty
            # checks a **{...} against every parameter: only full looseness admits it.
            return f"*args: {self.n['Any']}, **kwargs: {self.n['Any']}"
        # Python's calling convention (tools.binding): positional-or-keyword
        # parameters in binding order, then the keyword-only ones after `*`.
        params = parameters(tool)

        def one(name: str) -> str:
            annotation = self._type(props[name], root, f"{base}_{_field(name)}", 0, inputs=True)
            if name in params.required:
                return f"{name}: {annotation}"
            return f"{name}: {annotation} = {self._default(props[name], annotation)}"

        parts = [one(name) for name in params.positional]
        keyword_only = [one(name) for name in params.keyword_only]
        extra = None
        if accepts_extra_args(schema):
            more = schema.get("additionalProperties")
            kind = self._type(more, root, f"{base}_extra", 0, inputs=True) if isinstance(more, dict) else self.n["Any"]
            extra = f"**kwargs: {kind}"
        if keyword_only:
            parts += ["*", *keyword_only]
        if extra:
            parts.append(extra)
        return ", ".join(parts)

    def _default(self, prop: Any, annotation: str) -> str:
        value = prop.get("default", _MISSING) if isinstance(prop, dict) else _MISSING
        if value is _MISSING or (isinstance(value, float) and not math.isfinite(value)):
            return "..."
        text = _literal(value) if not isinstance(value, float) else repr(value)
        if text is None or len(text) > _MAX_DEFAULT_CHARS:
            return "..."
        # A default the annotation does not admit would read as a contradiction.
        if value is None and not annotation.endswith("None") and annotation != self.n["Any"]:
            return "..."
        return text

    # --- types ---------------------------------------------------------------

    def _type(self, schema: Any, root: _Root, hint: str, depth: int, *, inputs: bool) -> str:
        any_ = self.n["Any"]
        if not isinstance(schema, dict) or depth > _MAX_DEPTH:
            return any_
        if "$ref" in schema:
            return self._ref(schema["$ref"], root, hint, depth, inputs=inputs)
        if "const" in schema:
            lit = _literal(schema["const"])
            return f"{self.n['Literal']}[{lit}]" if lit not in (None, "None") else ("None" if lit else any_)
        if "enum" in schema and isinstance(schema["enum"], list):
            return self._enum(schema, root, hint, depth, inputs=inputs)
        for combinator in ("anyOf", "oneOf"):
            if isinstance(schema.get(combinator), list):
                members = [self._type(m, root, hint, depth + 1, inputs=inputs) for m in schema[combinator]]
                return self._union(members)
        all_of = schema.get("allOf")
        if isinstance(all_of, list):
            return self._type(all_of[0], root, hint, depth + 1, inputs=inputs) if len(all_of) == 1 else any_
        kind = schema.get("type")
        if isinstance(kind, list):
            members = [self._type({**schema, "type": k}, root, hint, depth, inputs=inputs) for k in kind]
            return self._union(members)
        if kind is None:
            kind = "object" if "properties" in schema else ("array" if "items" in schema else None)
        text = self._simple(kind, schema, root, hint, depth, inputs=inputs)
        if schema.get("nullable") is True:
            text = self._union([text, "None"])
        return text

    def _simple(self, kind: Any, schema: dict[str, Any], root: _Root, hint: str, depth: int, *, inputs: bool) -> str:
        n = self.n
        if kind == "string":
            return n["str"]
        if kind == "integer":
            return n["int"]
        if kind == "number":
            return n["float"]
        if kind == "boolean":
            return n["bool"]
        if kind == "null":
            return "None"
        if kind == "array":
            items = schema.get("items")
            # The element is what the field holds many of: it takes the field's name.
            item = self._type(items, root, hint, depth + 1, inputs=inputs) if isinstance(items, dict) else n["Any"]
            return f"{n['Sequence'] if inputs else n['list']}[{item}]"
        if kind == "object":
            props = schema.get("properties")
            if isinstance(props, dict) and props:
                # A titled object is usually a model (pydantic and OpenAPI sources
                # inline them): use its name, else where it sits (Parent_field).
                title = schema.get("title")
                named = _camel(title) if isinstance(title, str) and title.strip() else hint
                return self._object(self._class(schema, root, named, depth, path=hint), inputs=inputs)
            extra = schema.get("additionalProperties")
            value = self._type(extra, root, f"{hint}_value", depth + 1, inputs=inputs) if isinstance(extra, dict) else n["Any"]
            return f"{n['Mapping'] if inputs else n['dict']}[{n['str']}, {value}]"
        return n["Any"]

    def _enum(self, schema: dict[str, Any], root: _Root, hint: str, depth: int, *, inputs: bool) -> str:
        literals = [_literal(v) for v in schema["enum"]]
        if not literals or any(lit is None for lit in literals):
            rest = {k: v for k, v in schema.items() if k != "enum"}
            return self._type(rest, root, hint, depth, inputs=inputs)
        values = [lit for lit in dict.fromkeys(literals) if lit != "None"]
        members = [f"{self.n['Literal']}[{', '.join(values)}]"] if values else []  # type: ignore[arg-type]
        if "None" in literals:
            members.append("None")
        return self._union(members)

    def _union(self, members: list[str]) -> str:
        if self.n["Any"] in members or not members:
            return self.n["Any"]
        unique = list(dict.fromkeys(members))
        # None last reads as "optional"; the checker does not care about order.
        if "None" in unique:
            unique = [m for m in unique if m != "None"] + ["None"]
        return " | ".join(unique)

    def _ref(self, ref: Any, root: _Root, path: str, depth: int, *, inputs: bool) -> str:
        target = root.resolve(ref) if isinstance(ref, str) else None
        if target is None:
            return self.n["Any"]
        name, schema = target
        key = (root.defs_key, ref)
        if key in self._resolving:
            # Only shared classes (below) can refer to themselves; anything else
            # self-referencing has no finite Python spelling.
            return self.n["Any"]
        title = schema.get("title") if isinstance(schema, dict) else None
        hint = title if isinstance(title, str) else name
        if _is_class(schema) and schema.get("type", "object") == "object" and not schema.get("nullable"):
            return self._object(self._class(schema, root, _camel(hint), depth + 1, path=path), inputs=inputs)
        self._resolving.add(key)
        try:
            return self._type(schema, root, hint, depth + 1, inputs=inputs)
        finally:
            self._resolving.discard(key)

    def _object(self, cls: str, *, inputs: bool) -> str:
        n = self.n
        return f"{cls} | {n['Mapping']}[{n['str']}, {n['Any']}]" if inputs else cls

    def _class(self, schema: dict[str, Any], root: _Root, named: str, depth: int, *, path: str) -> str:
        """The class for an object shape: one per (name, content) in the module.

        Names come from the schema, never from a counter over the catalog: the
        title or definition name (``SimpleUser``), else the place the shape
        sits (``PullRequest_user``); the same name with other content takes
        its place's name, and only if that is taken too a ``_2``. So a tool's
        names depend on its own schema, and equal shapes share one class.
        """
        canon = _canon(schema)
        # A definition that refers to others is only the same if they are too.
        key = (named, canon, root.defs_key if '"$ref"' in canon else "")
        name = self._by_key.get(key)
        if name is not None:
            self._refs[-1][name] = None
            return name
        name = next((c for c in dict.fromkeys((named, path)) if c.isidentifier() and c not in self.taken), "")
        if not name:
            i = 2
            while f"{path}_{i}" in self.taken:
                i += 1
            name = f"{path}_{i}"
        self.taken.add(name)
        self._by_key[key] = name
        self._refs[-1][name] = None
        self.classes[name] = ""  # reserve the position; a recursive reference finds the name
        self._refs.append({})
        try:
            self.classes[name] = self._class_body(name, schema, root, depth)
        finally:
            self.class_deps[name] = self._refs.pop()
        return name

    def _class_body(self, name: str, schema: dict[str, Any], root: _Root, depth: int) -> str:
        required = set(schema.get("required") or [])
        fields: list[tuple[str, str]] = []
        for key, prop in schema["properties"].items():
            annotation = self._type(prop, root, f"{name}_{_field(key)}", depth + 1, inputs=False)
            if key not in required:
                annotation = f"{self.n['NotRequired']}[{annotation}]"
            fields.append((key, annotation))
        typed_dict = self.n["TypedDict"]
        if all(k.isidentifier() and not keyword.iskeyword(k) for k, _ in fields):
            body = "".join(f"    {k}: {a}\n" for k, a in fields)
            return f"class {name}({typed_dict}):\n{body}\n"
        # Keys like "user-id" or "from" need the functional form.
        items = ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {a}" for k, a in fields)
        return f"{name} = {typed_dict}({json.dumps(name)}, {{{items}}})\n\n"


def _is_class(schema: Any) -> bool:
    return isinstance(schema, dict) and isinstance(schema.get("properties"), dict) and bool(schema["properties"])
