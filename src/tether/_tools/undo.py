"""How a tool's write is undone: its compensation, and how the compensation's arguments follow (P-46).

A tool declares an :class:`Undo`: the address of the tool that undoes it, and
how that tool's arguments are made from the original call's arguments and
result — a function ``(args, result) -> dict`` (Python tools), or a mapping
from each argument to a path into them (config: ``"result.id"``,
``"args.owner"``) or a literal. Nothing here sends anything: the rollback
(``tether._engine.rollback``) computes the arguments once, journals them ahead
of the send, and sends what it journaled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from tether.errors import InvalidToolDefinition

# A mapping value naming the original call's arguments or result ("args", "result"), or a path into them:
# "args.<key>[.<key>...]", "result.<key>[...]" (a list's item by its index).
PATH_ROOTS = ("args", "result")
# A path is at most this many keys deep: a config value, never outside input, but bounded all the same.
MAX_PATH_KEYS = 16

UndoArgs = Callable[[dict[str, Any], Any], dict[str, Any]]


class UndoArgsError(Exception):
    """The compensation's arguments cannot be made from this call (a path the result lacks, a function that
    raised or returned no dict); the write is listed as not undone, with this message."""


@dataclass(frozen=True)
class Undo:
    """A tool's compensation (P-46): the tool that undoes it, and how its arguments follow."""

    address: str
    # A function of (the original arguments, its result), or a mapping argument -> path or literal; None: the
    # original result when it is an object, else the original arguments.
    args: UndoArgs | Mapping[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        namespace, sep, name = self.address.partition(".")
        if not (sep and namespace.isidentifier() and name.isidentifier()):
            raise InvalidToolDefinition(
                f"undo {self.address!r} must name a tool as 'namespace.name'",
                next_action="Name the compensation tool by its address, e.g. undo = \"shop.refund\".")
        if self.args is not None and not callable(self.args) and not isinstance(self.args, Mapping):
            raise InvalidToolDefinition(
                f"undo {self.address}: its arguments must be a function of (args, result) or a mapping",
                next_action='Give undo_args a function, or a table like {id = "result.id"}.')

    def shown(self) -> dict[str, Any]:
        """What ``describe`` and the approval page say about it: the compensation tool's address."""
        return {"tool": self.address}

    def arguments(self, args: dict[str, Any], result: Any) -> dict[str, Any]:
        """The compensation's arguments for an original call with ``args`` that returned ``result``."""
        how = self.args
        if how is None:
            return dict(result) if isinstance(result, dict) else dict(args)
        if callable(how):
            try:
                made = how(dict(args), result)
            except Exception as exc:  # noqa: BLE001 - a declaration's bug is reported as a write not undone
                raise UndoArgsError(f"its undo_args function raised {type(exc).__name__}: {exc}") from None
            if not isinstance(made, dict):
                raise UndoArgsError(f"its undo_args function returned {type(made).__name__}, not a dict")
            return made
        return {name: _value(spec, args, result) for name, spec in how.items()}


def _value(spec: Any, args: dict[str, Any], result: Any) -> Any:
    if not isinstance(spec, str):
        return spec
    if spec in PATH_ROOTS:  # the whole of it
        return dict(args) if spec == "args" else result
    root, dot, rest = spec.partition(".")
    if root not in PATH_ROOTS or not dot:
        return spec  # a literal string
    value: Any = args if root == "args" else result
    keys = rest.split(".")
    if len(keys) > MAX_PATH_KEYS:
        raise UndoArgsError(f"the path {spec!r} is more than {MAX_PATH_KEYS} keys deep")
    for key in keys:
        if isinstance(value, dict) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise UndoArgsError(f"the original call's {root} has no {spec!r}")
    return value


def undo_from_config(table: Mapping[str, Any], where: str) -> Undo:
    """An :class:`Undo` from a config table ``{tool = "ns.name", args = {...}}`` (MCP and OpenAPI sources)."""
    tool = table.get("tool")
    args = table.get("args")
    if not isinstance(tool, str) or (args is not None and not isinstance(args, Mapping)):
        raise InvalidToolDefinition(
            f"{where}: an undo is a table like {{tool = \"ns.name\", args = {{id = \"result.id\"}}}}",
            next_action="Name the compensation tool and, optionally, how each of its arguments is made.")
    return Undo(tool, dict(args) if args is not None else None)
