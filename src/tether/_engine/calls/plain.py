"""A tool's result as JSON, the common case fast: :func:`as_json` is ``to_json_value`` (tether._engine.attempt.result)
with dicts and lists of strings, numbers, bools and None copied by one tight recursion.

Such a value is already what the conversion makes of it, with nothing to note; the general walk (cycle
set, expansion counters, a call per leaf) took ~5 µs for a flat record and ~70 µs for a 3.5 KB page of
records, on the event loop, per host call. Anything else — a tuple, a set, bytes, a non-str key, a lone
surrogate, a huge int, NaN, a cycle or nesting past the depth limit, more than the bounds below — sends
the whole value to the general walk, which converts and notes it as before. A copy all the same, so a tool
that later changes what it returned changes nothing journaled.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from tether._engine.attempt.result import MAX_DEPTH, MAX_INT_DIGITS, to_json_value

# Below to_json_value's bounds: past either, the general walk cuts and notes.
_ITEMS = 100_000
_CHARS = 16 << 20
_SAFE_INT = 10 ** (MAX_INT_DIGITS - 1)  # as to_json_value: an int below it in absolute value prints as it is
_SURROGATE = re.compile("[\ud800-\udfff]")  # as to_json_value: a str holding one cannot be UTF-8


class _NotPlain(Exception):
    """Raised at the first value the general conversion has to look at."""


_NOT_PLAIN = _NotPlain()


def as_json(value: Any) -> tuple[Any, list[str]]:
    """``to_json_value(value)``: the value as plain JSON types, with notes on what changed."""
    t = type(value)
    try:
        if t is dict or t is list:
            return _copy(value, 0, [_ITEMS, _CHARS]), []
        return _copy([value], 0, [_ITEMS, _CHARS])[0], []
    except (_NotPlain, RecursionError):
        return to_json_value(value)


def _copy(v: dict[Any, Any] | list[Any], depth: int, budget: list[int]) -> Any:
    if depth >= MAX_DEPTH:
        raise _NOT_PLAIN
    budget[0] -= len(v)
    if budget[0] < 0:  # checked as it goes: a container repeated by reference expands without bound
        raise _NOT_PLAIN
    chars = 0
    items: Iterable[tuple[Any, Any]]
    if type(v) is dict:
        out: Any = {}
        items = v.items()
    else:
        out = []
        items = enumerate(v)
    is_dict = type(out) is dict
    for k, x in items:
        if is_dict and (type(k) is not str or not (k.isascii() or _SURROGATE.search(k) is None)):
            raise _NOT_PLAIN
        tx = type(x)
        if tx is str:
            if not x.isascii() and _SURROGATE.search(x) is not None:
                raise _NOT_PLAIN
            chars += len(x)
        elif tx is int:
            if not -_SAFE_INT < x < _SAFE_INT:
                raise _NOT_PLAIN
        elif tx is float:
            if x - x != 0.0:  # inf or nan
                raise _NOT_PLAIN
        elif tx is dict or tx is list:
            x = _copy(x, depth + 1, budget)
        elif x is not None and tx is not bool:
            raise _NOT_PLAIN
        if is_dict:
            out[k] = x
        else:
            out.append(x)
    budget[1] -= chars
    if budget[1] < 0:
        raise _NOT_PLAIN
    return out
