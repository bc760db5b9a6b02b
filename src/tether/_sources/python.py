"""Tools from plain Python functions: ``@tool``, :func:`tools_from_module` and :class:`PythonSource`.

::

    TETHER_NAMESPACE = "weather"   # optional; else the module's last name

    @tool(read_only=True)
    async def forecast(city: str, days: int = 3) -> list[Day]:
        \"\"\"Daily forecast for a city.\"\"\"

    @tool(idempotent_with_key=True)
    async def refund(order: str, call: CallContext) -> dict:
        \"\"\"Refund an order; the payment API dedupes by call.key.\"\"\"

A parameter annotated :class:`~tether.CallContext` is not part of the
schema: it receives the call's context (seq, run id, idempotency key, send)
— the same value ``tether.current_call()`` returns. The input schema comes from the signature through pydantic (models,
TypedDicts, ``Annotated[..., Field(...)]`` all work), the description from
the docstring's first paragraph, the output schema from the return
annotation. The function itself is unchanged and stays callable.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import inspect
import os
import re
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, TypeVar, overload

import pydantic
from pydantic_core import ArgsKwargs, PydanticSerializationError, to_jsonable_python

from tether._tools.context import CallContext, current_call
from tether._tools.model import Annotations, Tool
from tether._tools.trust import check_labels
from tether._tools.undo import Undo, UndoArgs
from tether.errors import (
    InvalidArguments,
    InvalidToolDefinition,
    SourceNotStarted,
    TetherError,
    ToolsInvalid,
    UsageError,
)

if TYPE_CHECKING:
    # The kinds' registry holds every [[sources]] model (pydantic, ~10 ms to build): a program that only
    # decorates tools with @tether.tool never needs it; the config and the loader import it.
    from tether._sources.kinds import SourceContext

__all__ = ["PythonSource", "ToolSpec", "tool", "tools_from_module"]

F = TypeVar("F", bound=Callable[..., Any])

# Google-style "Args:" sections give parameter descriptions for free.
_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters|Params)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s*\*{0,2}(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


@dataclass(frozen=True)
class ToolSpec:
    """What ``@tool`` recorded; :meth:`to_tool` turns it into a :class:`Tool`.

    The schema is built late, on collection, so annotations may name classes
    defined further down the module.
    """

    func: Callable[..., Any]
    namespace: str | None
    name: str
    title: str | None
    annotations: Annotations
    idempotency: str = "none"
    undo: Undo | None = None
    # Labels for a write guarded by lineage (P-45, D-73), checked by @tool (tether._tools.trust).
    trust: str | None = None
    trust_fields: Mapping[str, str] | None = None
    roles: Mapping[str, str] | None = None

    def to_tool(self, default_namespace: str | None = None) -> Tool:
        """Build the tool; ``default_namespace`` applies when neither ``@tool`` nor the module names one."""
        namespace = self.namespace or _module_namespace(self.func) or default_namespace or _module_tail(self.func)
        return _build(self, namespace)


@overload
def tool(func: F, /) -> F: ...


@overload
def tool(
    *,
    namespace: str | None = None,
    name: str | None = None,
    title: str | None = None,
    read_only: bool = False,
    destructive: bool = False,
    idempotent: bool = False,
    open_world: bool = False,
    idempotent_with_key: bool = False,
    undo: str | None = None,
    undo_args: UndoArgs | Mapping[str, Any] | None = None,
    trust: Literal["trusted", "untrusted"] | None = None,
    trust_fields: Mapping[str, Literal["trusted", "untrusted"]] | None = None,
    roles: Mapping[str, Literal["destination", "content"]] | None = None,
) -> Callable[[F], F]: ...


def tool(
    func: Callable[..., Any] | None = None,
    *,
    namespace: str | None = None,
    name: str | None = None,
    title: str | None = None,
    read_only: bool = False,
    destructive: bool = False,
    idempotent: bool = False,
    open_world: bool = False,
    idempotent_with_key: bool = False,
    undo: str | None = None,
    undo_args: UndoArgs | Mapping[str, Any] | None = None,
    trust: Literal["trusted", "untrusted"] | None = None,
    trust_fields: Mapping[str, Literal["trusted", "untrusted"]] | None = None,
    roles: Mapping[str, Literal["destination", "content"]] | None = None,
) -> Any:
    """Mark a sync or async function as a tool; use bare (``@tool``) or with options.

    The function is returned unchanged apart from a ``__tether_tool__``
    attribute holding its :class:`ToolSpec`. ``read_only`` is what the write
    policy reads: leave it False for anything that changes the world.
    ``idempotent_with_key`` promises that the function makes repeated calls
    with one idempotency key (``current_call().key``) take effect once, so
    tether may call it again with the same key when a call's outcome was lost
    (P-31); ``idempotent`` alone is a hint and never does.
    ``undo`` names the tool that undoes a call of this one (its compensation,
    P-46) and ``undo_args`` how its arguments follow: a function of
    ``(args, result)`` returning them, or a mapping of each to ``"args.<key>"``,
    ``"result.<key>"`` or a literal (without it: the result, when an object).
    ``trust``, ``trust_fields`` and ``roles`` label the tool for ``Policy(writes="guard")`` (P-45, D-73), as a
    ``[[sources]]`` table's keys of those names do, the tool's name left out: ``trust="trusted"`` for a tool
    whose results only the user or the operator wrote (a contacts directory; without a label a tool is
    untrusted), ``trust_fields={"notes": "untrusted"}`` for a field of its result that differs,
    ``roles={"ref": "destination"}`` for an argument whose name does not say it is one.
    """

    def mark(f: Callable[..., Any]) -> Callable[..., Any]:
        if not callable(f):
            raise InvalidToolDefinition(f"@tool needs a function, got {type(f).__name__}")
        labels = check_labels(f"{namespace + '.' if namespace else ''}{name or getattr(f, '__name__', '?')}",
                              trust, trust_fields, roles, _argument_names(f))
        f.__tether_tool__ = ToolSpec(  # type: ignore[attr-defined]
            func=f,
            namespace=namespace,
            name=name or f.__name__,
            title=title,
            annotations=Annotations(read_only, destructive, idempotent, open_world),
            idempotency="key" if idempotent_with_key else "none",
            undo=Undo(undo, undo_args) if undo is not None else None,
            trust=labels[0],
            trust_fields=labels[1],
            roles=labels[2],
        )
        return f

    return mark(func) if func is not None else mark


def _argument_names(func: Callable[..., Any]) -> list[str] | None:
    """The names a call can pass ``func``; None when it takes any (``**kwargs``) or has no readable signature
    (the schema builder reports that)."""
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind is not p.VAR_POSITIONAL]


def tools_from_module(module: ModuleType | str | Path) -> list[Tool]:
    """Every ``@tool`` function in a module object, a dotted module name or a ``.py`` path.

    A path is loaded under a unique module name (so two ``tools.py`` files do
    not collide) and its tools default to the file's stem as namespace.
    Functions imported into the module from elsewhere are collected too,
    keeping their own module's namespace.
    """
    default_ns: str | None = None
    if isinstance(module, Path) or (isinstance(module, str) and (module.endswith(".py") or "/" in module)):
        path = Path(module).expanduser().resolve()
        module = _load_file(path)
        default_ns = _identifier(path.stem)
    elif isinstance(module, str):
        try:
            module = importlib.import_module(module)
        except ImportError as exc:
            raise InvalidToolDefinition(
                f"cannot import tool module {module!r}: {exc}",
                next_action="Check the module name and that it is importable (PYTHONPATH).",
            ) from None
    tools: list[Tool] = []
    seen: set[int] = set()
    for value in list(vars(module).values()):
        spec = getattr(value, "__tether_tool__", None)
        if isinstance(spec, ToolSpec) and id(spec) not in seen:
            seen.add(id(spec))
            own = getattr(spec.func, "__module__", None) == module.__name__
            tools.append(spec.to_tool(default_ns if own else None))
    return tools


def module_summary(module: ModuleType | str | Path) -> str | None:
    """The first line of a tool module's docstring: its namespace's one line for sources() and the prompt.

    Takes what :func:`tools_from_module` took, after it has loaded it.
    """
    if isinstance(module, Path) or (isinstance(module, str) and (module.endswith(".py") or "/" in module)):
        path = Path(module).expanduser().resolve()
        module = sys.modules.get(_file_module_name(path))  # type: ignore[assignment]
    elif isinstance(module, str):
        module = sys.modules.get(module)  # type: ignore[assignment]
    doc = inspect.getdoc(module) if isinstance(module, ModuleType) else None
    line = doc.strip().split("\n\n", 1)[0] if doc else ""
    return " ".join(line.split()) or None


class PythonSource:
    """A module's (or a ``.py`` file's) ``@tool`` functions as a source (``type = "python"``, ``--tools``).

    ``namespace`` replaces the tools' own; ``idempotency="key"`` says every
    one of them dedupes by the call's idempotency key. A module that cannot be
    imported fails :meth:`start` with ``tools_invalid`` naming why, never a traceback.
    """

    def __init__(self, module: str, *, namespace: str | None = None, idempotency: str = "none") -> None:
        self.module = module
        self.namespace = namespace
        self.idempotency = idempotency
        self.problems: list[dict[str, str]] = []
        self.summary: str | None = None
        self._tools: list[Tool] | None = None

    def __repr__(self) -> str:
        return f"PythonSource({self.module!r})"

    @property
    def started(self) -> bool:
        return self._tools is not None

    async def start(self) -> None:
        found = _import_tools(self.module)
        self.summary = module_summary(self.module)
        if self.namespace:
            found = [dataclasses.replace(t, namespace=self.namespace) for t in found]
        if self.idempotency == "key":
            found = [dataclasses.replace(t, idempotency="key") for t in found]
        self._tools = found

    def tools(self) -> list[Tool]:
        if self._tools is None:
            raise SourceNotStarted(f"Python source {self.module!r} is not started",
                                   next_action="Call and await start() before tools().")
        return list(self._tools)

    async def ensure_live(self) -> None:
        """Nothing to connect: the functions run in this process."""

    async def close(self) -> None:
        """Nothing to release: an imported module stays imported."""


def from_definition(definition: dict[str, Any], context: SourceContext) -> PythonSource:
    """A ``python`` source (tether._sources.kinds) from its recorded definition, not started yet."""
    return PythonSource(definition["module"], namespace=definition.get("namespace"),
                        idempotency=definition.get("idempotency", "none"))


def _import_tools(spec: str) -> list[Tool]:
    """The tools of a ``--tools`` module or file; a module that cannot load is a named error, not a traceback."""
    try:
        tools = tools_from_module(spec)
    except TetherError:
        raise
    except SyntaxError as exc:
        raise ToolsInvalid(f"--tools {spec}: syntax error on line {exc.lineno}: {exc.msg}; nothing was run",
                           details={"tools": spec, "line": exc.lineno},
                           next_action=f"Fix {exc.filename or spec} (python -m py_compile shows the error).") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the module's own code raised while importing
        raise ToolsInvalid(f"--tools {spec}: importing it raised {type(exc).__name__}: {_short(exc)}; nothing was run",
                           details={"tools": spec, "type": type(exc).__name__},
                           next_action=f"Fix the error {spec} raises at import time (python -c 'import ...' "
                                       "shows the traceback).") from None
    if not tools:
        # Plain functions are not tools; without this the program meets an empty catalog and blames itself.
        raise ToolsInvalid(f"--tools {spec}: defines no @tool functions; nothing was run", details={"tools": spec},
                           next_action="Decorate the functions the program may call with @tool (from tether import "
                                       "tool), or pass the module that does.")
    return tools


def _short(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001
        return "(no message)"
    return text if len(text) <= 500 else text[:500] + "…"


def _file_module_name(path: Path) -> str:
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    return f"tether_source_{_identifier(path.stem)}_{digest}"


def _load_file(path: Path) -> ModuleType:
    if not path.is_file():
        raise InvalidToolDefinition(f"tool file {str(path)!r} does not exist")
    name = _file_module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InvalidToolDefinition(f"cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    # Registered before running: pydantic, dataclasses and pickling look modules up by name.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


def _module_namespace(func: Callable[..., Any]) -> str | None:
    module = sys.modules.get(getattr(func, "__module__", "") or "")
    value = getattr(module, "TETHER_NAMESPACE", None)
    return value if isinstance(value, str) and value else None


def _module_tail(func: Callable[..., Any]) -> str:
    module = getattr(func, "__module__", None) or "tools"
    if module == "__main__":
        # A tool defined in the script being run: `__main__` says nothing, its file's stem does.
        path = getattr(sys.modules.get("__main__"), "__file__", None)
        if not path:
            raise InvalidToolDefinition(
                f"@tool {getattr(func, '__name__', '?')} is defined in __main__ without a file, so it has no "
                "namespace to default to: pass @tool(namespace=...)",
                next_action="Pass @tool(namespace=...) or set TETHER_NAMESPACE = '...' in the script.",
            )
        module = os.path.splitext(os.path.basename(path))[0]
    return _identifier(module.rpartition(".")[2])


def _identifier(text: str) -> str:
    name = re.sub(r"\W", "_", text)
    return name if name and not name[0].isdigit() else f"_{name}"


# --- building the tool --------------------------------------------------------


def _build(spec: ToolSpec, namespace: str) -> Tool:
    func = spec.func
    where = f"{namespace}.{spec.name}"
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        raise _definition_error(where, f"has no readable signature ({exc})") from None
    for param in signature.parameters.values():
        if param.kind in (param.POSITIONAL_ONLY, param.VAR_POSITIONAL):
            # A call is journaled as one keyword dict (tools.binding): every
            # parameter needs a name it can be bound to.
            raise _definition_error(
                where, f"parameter {param.name!r} cannot be passed by keyword; every tool parameter needs a name"
            )

    # Validate against a stand-in with the same signature, so validation never
    # runs the function and a ValidationError raised *inside* it stays the tool's own.
    @functools.wraps(func)
    def _bind(*args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return args, kwargs

    # Parameters annotated CallContext are filled by tether, not by the program.
    context_params = _context_params(func, signature)
    if context_params:
        _bind.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[p for p in signature.parameters.values() if p.name not in context_params])
        _bind.__annotations__ = {k: v for k, v in getattr(func, "__annotations__", {}).items()
                                 if k not in context_params}

    try:
        # Given a function, pydantic builds the schema of its parameters; its stubs name only types.
        adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(_bind)  # type: ignore[arg-type]
        input_schema = _tidy(adapter.json_schema())
        output_schema = _output_schema(func)
    except pydantic.PydanticUserError as exc:
        raise _definition_error(where, f"has a type pydantic cannot use: {exc.message}") from None
    except (pydantic.errors.PydanticSchemaGenerationError, NameError, TypeError) as exc:
        raise _definition_error(where, f"has a type pydantic cannot use: {exc}") from None
    _add_param_docs(input_schema, inspect.getdoc(func) or "")
    if any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values()):
        # **kwargs takes names the schema cannot list; say so, or stubs and validation refuse them.
        input_schema.setdefault("additionalProperties", True)

    # pydantic's own validator, called without TypeAdapter.validate_python's wrapper (its options are not
    # used): one Python frame fewer on every call of the tool (core_bench).
    validate = adapter.validator.validate_python
    is_async = inspect.iscoroutinefunction(func)

    async def handler(args: dict[str, Any]) -> Any:
        try:
            bound_args, bound_kwargs = validate(ArgsKwargs((), args))
        except pydantic.ValidationError as exc:
            raise InvalidArguments(f"{where}: {_validation_message(exc)}", details={"address": where}) from None
        if context_params:
            call = current_call()
            bound_kwargs.update((name, call) for name in context_params)
        result = func(*bound_args, **bound_kwargs)
        if is_async or inspect.isawaitable(result):
            result = await result
        try:
            return to_jsonable_python(result)
        except (ValueError, PydanticSerializationError):
            # Bytes that are not UTF-8, a type pydantic cannot serialize: the
            # boundary's conversion takes any value and notes what it changed.
            return result

    return Tool(
        namespace=namespace,
        name=spec.name,
        description=_summary(inspect.getdoc(func) or ""),
        input_schema=input_schema,
        handler=handler,
        title=spec.title,
        output_schema=output_schema,
        annotations=spec.annotations,
        source="python",
        validates_args=True,
        keyword_only=tuple(p.name for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY
                           and p.name not in context_params),
        idempotency=spec.idempotency,
        undo=spec.undo,
        trust=spec.trust,
        trust_fields=spec.trust_fields,
        roles=spec.roles,
    )


def _context_params(func: Callable[..., Any], signature: inspect.Signature) -> set[str]:
    try:
        hints = typing.get_type_hints(func)
    except Exception:  # unresolvable hints are reported by the schema builder
        hints = {}
    found = set()
    for name in signature.parameters:
        hint = hints.get(name)
        if hint is CallContext or (typing.get_origin(hint) in (typing.Union, types.UnionType)
                                   and CallContext in typing.get_args(hint)):
            found.add(name)
    return found


def _output_schema(func: Callable[..., Any]) -> dict[str, Any] | None:
    hints = _return_hint(func)
    if hints is inspect.Signature.empty or hints is Any:
        return None
    if hints is None or hints is type(None):
        return {"type": "null"}
    return pydantic.TypeAdapter(hints).json_schema(mode="serialization")


def _return_hint(func: Callable[..., Any]) -> Any:
    if "return" not in getattr(func, "__annotations__", {}):
        return inspect.Signature.empty
    # include_extras keeps Annotated descriptions; the module's globals resolve
    # string annotations (``from __future__ import annotations``).
    return typing.get_type_hints(func, include_extras=True).get("return", inspect.Signature.empty)


def _definition_error(where: str, problem: str) -> UsageError:
    return InvalidToolDefinition(
        f"tool {where} {problem}",
        next_action="Fix the function's signature or annotations.",
    )


def _tidy(schema: dict[str, Any]) -> dict[str, Any]:
    # pydantic titles every property with its own name re-cased ("city" → "City"):
    # bytes in every describe() without information.
    for name, prop in (schema.get("properties") or {}).items():
        if isinstance(prop, dict) and prop.get("title") == name.replace("_", " ").title():
            del prop["title"]
    schema.pop("title", None)
    return schema


def _summary(doc: str) -> str:
    first = doc.strip().split("\n\n", 1)[0]
    return " ".join(first.split())


def _add_param_docs(schema: dict[str, Any], doc: str) -> None:
    props = schema.get("properties") or {}
    docs: dict[str, str] = {}
    current: str | None = None
    in_args = False
    indent = 0
    for line in doc.splitlines():
        if _ARGS_HEADER.match(line):
            in_args, indent = True, len(line) - len(line.lstrip())
            continue
        if not in_args:
            continue
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break  # the next section ("Returns:") ends the arguments
        match = _ARG_LINE.match(line)
        if match and match.group(1) in props:
            current = match.group(1)
            docs[current] = match.group(3).strip()
        elif current and line.strip():
            docs[current] += " " + line.strip()
    for name, text in docs.items():
        prop = props[name]
        if text and isinstance(prop, dict) and "description" not in prop:
            prop["description"] = text


def _validation_message(exc: pydantic.ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False):
        loc = error.get("loc", ())
        field = ".".join(str(p) for p in loc)
        what = "argument" if len(loc) == 1 else "field"  # same words as Catalog.validate_args
        kind = error.get("type", "")
        if kind in ("missing_argument", "missing", "missing_keyword_only_argument"):
            problems.append(f"missing required {what} {field!r}")
        elif kind in ("unexpected_keyword_argument", "extra_forbidden"):
            problems.append(f"unknown {what} {field!r}")
        else:
            problems.append(f"{what} {field!r}: {error.get('msg', 'is invalid')}")
    return "; ".join(problems) or str(exc)
