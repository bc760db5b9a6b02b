"""How a call's arguments bind to a tool's parameters: Python's rules, one place.

A program may pass arguments by position, by keyword, or both, as it would
call a Python function. The order positional arguments fill is the one
``describe()`` shows and the stubs declare:

* a Python tool: its signature's order; keyword-only parameters stay
  keyword-only (``Tool.keyword_only``);
* an MCP or OpenAPI tool: the required parameters in the schema's order,
  then the optional ones.

Stubs (the declaration), ``describe`` (the text) and the effect boundary (the
call) all read :func:`tools.params.parameters`, so they cannot disagree. The journal always
records the bound keyword dict: a call made positionally and the same call
made by keyword are one call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tether._tools.params import parameters
from tether._tools.stubs import render_signature
from tether.errors import InvalidArguments

if TYPE_CHECKING:
    from tether._tools.model import Tool

__all__ = ["bind", "positional_problem", "signature_text"]


def bind(tool: "Tool", args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword dict a call ``tool(*args, **kwargs)`` means.

    Too many positional arguments, or a positional and a keyword argument for
    the same parameter, raise ``InvalidArguments`` showing the signature.
    Missing, unknown and ill-typed arguments are left to schema validation,
    which names them all at once.
    """
    if not args:
        return dict(kwargs)
    params = parameters(tool)
    if len(args) > len(params.positional):
        n = len(params.positional)
        taken = f"{n} positional argument{'s' if n != 1 else ''}" if n else "no positional arguments"
        raise _refused(tool, f"takes {taken} but {len(args)} were given")
    out = dict(zip(params.positional, args))
    for key, value in kwargs.items():
        if key in out:
            raise _refused(tool, f"got multiple values for argument {key!r}")
        out[key] = value
    return out


def positional_problem(tool: "Tool", n_args: int, keywords: list[str]) -> str | None:
    """What :func:`bind` would refuse about a call with ``n_args`` positionals and these keywords."""
    params = parameters(tool)
    if n_args > len(params.positional):
        n = len(params.positional)
        taken = f"{n} positional argument{'s' if n != 1 else ''}" if n else "no positional arguments"
        return f"takes {taken} but {n_args} were given"
    filled = set(params.positional[:n_args])
    for key in keywords:
        if key in filled:
            return f"got multiple values for argument {key!r}"
    return None


def _refused(tool: "Tool", problem: str) -> InvalidArguments:
    return InvalidArguments(
        f"{tool.address}() {problem}; signature: {signature_text(tool)}",
        details={"address": tool.address, "signature": signature_text(tool)},
    )


def signature_text(tool: "Tool") -> str:
    """``tools.ns.name(a: int, b: str = ..., *, c: bool = ...)``: the call shape, for messages."""
    text = render_signature(tool)
    return text[len("async def "):] if text.startswith("async def ") else text
