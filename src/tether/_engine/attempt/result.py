"""The result envelope and the conversion of sandbox values to JSON.

Anything that came out of the sandbox is made JSON here, never pickled: a set
becomes a sorted list, bytes become text (or base64), a cycle is cut, and every
such change is noted so nobody mistakes a converted value for the original.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from tether._store.states import RunStatus

MAX_DEPTH = 64
# Python refuses to print an int of more digits than this (sys.int_max_str_digits,
# CVE-2020-10735), and so would json.dumps: such an int becomes a string.
MAX_INT_DIGITS = 4300
# Up to here the string is exact (a few ms); past it, conversion is quadratic
# and nobody reads the digits: it becomes "~1.2345e+N" with a note.
MAX_EXACT_INT_DIGITS = 20_000
MAX_REPR_CHARS = 1000
# The most a converted value holds: far past a journaled value (1 MiB) or a
# result preview, and about a second of conversion. Conversion is linear in
# what it produces, so these bound its time whatever the value (D-34).
MAX_EXPANDED_ITEMS = 2_000_000
MAX_EXPANDED_CHARS = 64 * 1024 * 1024
_LOG10_2 = math.log10(2)
# Ints below this (in absolute value) print without a second look.
_SAFE_INT = 10 ** (MAX_INT_DIGITS - 1)
# A str holding one of these cannot be encoded as UTF-8 (so not stored or sent).
_SURROGATE = re.compile("[\ud800-\udfff]")
# json.dumps with an option builds a new encoder on every call: one, built once (the same text).
_PREVIEW = json.JSONEncoder(ensure_ascii=False)


def to_json_value(value: Any) -> tuple[Any, list[str]]:
    """Convert ``value`` to plain JSON types; return it with notes on what changed.

    Total: whatever ``value`` is — a huge int, a string that is not valid
    Unicode, a cycle, an object whose ``repr`` raises — the result is JSON that
    ``json.dumps(..., allow_nan=False)`` accepts and UTF-8 can encode, and
    anything that had to change is noted.
    """
    notes: list[str] = []
    seen: set[int] = set()
    # What the converted value may hold, counted as it expands: a container the
    # program repeats by reference ([a] * 100, nested) is one object in the
    # sandbox and a copy per appearance here, so its size is not bounded by the
    # sandbox heap and could grow exponentially with the nesting.
    left = [MAX_EXPANDED_ITEMS, MAX_EXPANDED_CHARS]
    slow: list[Callable[[Any, int], Any]] = []  # convert, once defined (below)

    def conv(v: Any, depth: int) -> Any:
        # The common values first, without a call: most results are records of these.
        t = type(v)
        if t is str and (v.isascii() or _SURROGATE.search(v) is None):
            left[1] -= len(v)
            if left[1] < 0:
                return _cut_off(notes)
            return v
        if t is int and -_SAFE_INT < v < _SAFE_INT:
            return v
        if t is float and math.isfinite(v):
            return v
        try:
            return slow[0](v, depth)
        except Exception as exc:  # noqa: BLE001 - nothing a value does may stop the conversion
            notes.append(f"a value of type {_type_name(v)} could not be converted ({type(exc).__name__}) "
                         "and became a placeholder")
            return f"<{_type_name(v)}>"

    def convert(v: Any, depth: int) -> Any:
        if v is None or isinstance(v, bool):
            return v
        if isinstance(v, int):
            return _int(v, notes)
        if isinstance(v, str):
            return _text(v, notes)
        if isinstance(v, float):
            if math.isfinite(v):
                return v
            notes.append(f"non-finite float {v!r} became a string")
            return repr(v)
        if depth > MAX_DEPTH:
            notes.append(f"nesting deeper than {MAX_DEPTH} was cut")
            return "<too deep>"
        ident = id(v)
        if ident in seen:
            notes.append("a reference cycle was cut")
            return "<cycle>"
        if isinstance(v, (list, tuple, dict, set, frozenset)):
            left[0] -= len(v)
            if left[0] < 0:
                return _cut_off(notes)
        if isinstance(v, (list, tuple)):
            seen.add(ident)
            listed = [conv(x, depth + 1) for x in v]
            seen.discard(ident)
            return listed
        if isinstance(v, dict):
            seen.add(ident)
            out: dict[str, Any] = {}
            for k, x in v.items():
                if not isinstance(k, str):
                    notes.append(f"a dict key of type {_type_name(k)} became a string")
                    key = conv(k, depth + 1)
                    k = key if isinstance(key, str) else json.dumps(key, ensure_ascii=False)
                elif not k.isascii():
                    k = _text(k, notes)
                out[k] = conv(x, depth + 1)
            seen.discard(ident)
            return out
        if isinstance(v, (set, frozenset)):
            notes.append("a set became a sorted list")
            items = [conv(x, depth + 1) for x in v]
            try:
                return sorted(items)
            except TypeError:
                return sorted(items, key=lambda x: json.dumps(x, sort_keys=True))
        if isinstance(v, (bytes, bytearray, memoryview)):
            try:
                text = bytes(v).decode("utf-8")
                notes.append("bytes became UTF-8 text")
                return text
            except UnicodeDecodeError:
                notes.append("bytes became base64 text")
                return base64.b64encode(bytes(v)).decode("ascii")
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            seen.add(ident)
            fields = {f.name: conv(getattr(v, f.name, None), depth + 1) for f in dataclasses.fields(v)}
            seen.discard(ident)
            return fields
        attrs = getattr(v, "attributes", None)
        if isinstance(attrs, dict):  # Monty's proxy for an instance of a program-defined class
            notes.append(f"an instance of {getattr(v, 'name', 'a class')} became a dict")
            return conv(attrs, depth + 1)
        notes.append(f"a value of type {_type_name(v)} became its repr")
        return _text(safe_repr(v), notes)

    slow.append(convert)
    converted = conv(value, 0)
    # conv reached convert through this list, convert calls conv: emptied, the pair is no reference cycle and
    # is freed now, not by the cyclic collector (11 pairs an execute of 10 calls; core_bench.py).
    slow.clear()
    # Keep notes short and unique: a set of 10,000 elements is one note.
    unique = list(dict.fromkeys(notes))
    return converted, unique


def _cut_off(notes: list[str]) -> str:
    notes.append(f"the value expands past {MAX_EXPANDED_ITEMS:,} elements or {MAX_EXPANDED_CHARS:,} characters "
                 "(a container or string repeated by reference counts each time it appears); the rest was cut")
    return "<cut>"


def _type_name(v: Any) -> str:
    try:
        return type(v).__name__
    except Exception:  # noqa: BLE001
        return "value"


def safe_repr(v: Any, limit: int = MAX_REPR_CHARS) -> str:
    """``repr(v)`` cut to ``limit`` characters, or ``<type>`` when repr itself fails."""
    try:
        text = repr(v)
    except Exception:  # noqa: BLE001 - a hostile __repr__, a huge int, a deep structure
        return f"<{_type_name(v)}>"
    if not isinstance(text, str):
        return f"<{_type_name(v)}>"
    return text if len(text) <= limit else text[:limit] + "…"


def _int(v: int, notes: list[str]) -> Any:
    v = int(v)  # an int subclass (an enum) is its value
    bits = v.bit_length()
    # Cheap bound first: bits * log10(2) is within one of the digit count.
    if bits * _LOG10_2 < MAX_INT_DIGITS - 1:
        return v
    digits = int(bits * _LOG10_2) + 1
    if digits <= MAX_EXACT_INT_DIGITS:
        import decimal

        with decimal.localcontext() as ctx:
            ctx.prec = MAX_EXACT_INT_DIGITS + 10
            text = format(decimal.Decimal(v), "f")
        if len(text.lstrip("-")) <= MAX_INT_DIGITS:
            return v
        notes.append(f"an int of {len(text.lstrip('-'))} digits became a string (JSON numbers stop at "
                     f"{MAX_INT_DIGITS} digits)")
        return text
    # Leading digits from the top 64 bits; the exponent from the bit length.
    shift = max(bits - 64, 0)
    top = abs(v) >> shift
    exponent10 = math.log10(top) + shift * _LOG10_2
    power = int(exponent10)
    mantissa = 10 ** (exponent10 - power)
    notes.append(f"an int of about {power + 1} digits became an approximate string")
    return f"{'-' if v < 0 else ''}~{mantissa:.6f}e+{power}"


def _text(s: str, notes: list[str]) -> str:
    if s.isascii():
        return s
    if _SURROGATE.search(s) is not None:
        # Lone surrogates (e.g. bytes decoded with surrogateescape): not
        # Unicode, so neither JSON nor the store could carry them.
        notes.append("a string that was not valid Unicode had its unpaired surrogates escaped")
        return s.encode("utf-8", "backslashreplace").decode("utf-8")
    return str(s)


def preview(value: Any, max_bytes: int) -> tuple[Any, dict[str, Any] | None]:
    """Cut a JSON value to ``max_bytes`` of its JSON text; say how much was cut."""
    text = _PREVIEW.encode(value)
    data = text.encode()
    size = len(data)
    if size <= max_bytes:
        return value, None
    cut = data[:max_bytes].decode("utf-8", "ignore")
    return cut, {"original_bytes": size, "kept_bytes": len(cut.encode())}


@dataclass
class RunResult:
    """What a run reports: the envelope of the Python API and ``--json``."""

    status: str  # completed | failed | paused | waiting | cancelled | running | queued
    run_id: str
    result: Any = None
    logs: list[str] = field(default_factory=list)
    error: dict[str, Any] | None = None
    calls: int = 0
    diagnostics: dict[str, Any] = field(default_factory=dict)
    pending: dict[str, Any] | None = None
    expires_at: float | None = None
    instructions: str | None = None
    notes: list[str] = field(default_factory=list)
    # A rolled-back run's writes, newest first: each with its undo, or why it was not undone (P-46).
    rollback: list[dict[str, Any]] | None = None

    @property
    def ok(self) -> bool:
        return self.status == RunStatus.COMPLETED

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "status": self.status,
            "run_id": self.run_id,
            "result": self.result,
            "logs": self.logs,
            "error": self.error,
            "calls": self.calls,
            "diagnostics": self.diagnostics,
        }
        if self.notes:
            out["notes"] = self.notes
        if self.rollback is not None:
            out["rollback"] = self.rollback
        if self.status in (RunStatus.PAUSED, RunStatus.WAITING):
            out["pending"] = self.pending
            out["expires_at"] = self.expires_at
            out["instructions"] = self.instructions
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunResult":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})
