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
from dataclasses import dataclass, field
from typing import Any

MAX_DEPTH = 64


def to_json_value(value: Any) -> tuple[Any, list[str]]:
    """Convert ``value`` to plain JSON types; return it with notes on what changed."""
    notes: list[str] = []
    seen: set[int] = set()

    def conv(v: Any, depth: int) -> Any:
        if v is None or isinstance(v, (bool, int, str)):
            return v
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
        if isinstance(v, (list, tuple)):
            seen.add(ident)
            out = [conv(x, depth + 1) for x in v]
            seen.discard(ident)
            return out
        if isinstance(v, dict):
            seen.add(ident)
            out = {}
            for k, x in v.items():
                if not isinstance(k, str):
                    notes.append(f"dict key {k!r} became a string")
                    k = str(k) if not isinstance(k, (tuple, frozenset)) else json.dumps(conv(k, depth + 1))
                out[k] = conv(x, depth + 1)
            seen.discard(ident)
            return out
        if isinstance(v, (set, frozenset)):
            notes.append("a set became a sorted list")
            items = [conv(x, depth + 1) for x in v]
            try:
                return sorted(items)
            except TypeError:
                return sorted(items, key=repr)
        if isinstance(v, (bytes, bytearray)):
            try:
                text = bytes(v).decode("utf-8")
                notes.append("bytes became UTF-8 text")
                return text
            except UnicodeDecodeError:
                notes.append("bytes became base64 text")
                return base64.b64encode(bytes(v)).decode("ascii")
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return conv(dataclasses.asdict(v), depth + 1)
        attrs = getattr(v, "attributes", None)
        if isinstance(attrs, dict):  # Monty's proxy for an instance of a program-defined class
            notes.append(f"an instance of {getattr(v, 'name', 'a class')} became a dict")
            return conv(attrs, depth + 1)
        notes.append(f"a {type(v).__name__} became its repr")
        return repr(v)

    converted = conv(value, 0)
    # Keep notes short and unique: a set of 10,000 elements is one note.
    unique = list(dict.fromkeys(notes))
    return converted, unique


def preview(value: Any, max_bytes: int) -> tuple[Any, dict[str, Any] | None]:
    """Cut a JSON value to ``max_bytes`` of its JSON text; say how much was cut."""
    text = json.dumps(value, ensure_ascii=False, sort_keys=False)
    size = len(text.encode())
    if size <= max_bytes:
        return value, None
    cut = text.encode()[:max_bytes].decode("utf-8", "ignore")
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

    @property
    def ok(self) -> bool:
        return self.status == "completed"

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
        if self.status in ("paused", "waiting"):
            out["pending"] = self.pending
            out["expires_at"] = self.expires_at
            out["instructions"] = self.instructions
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunResult":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in fields})
