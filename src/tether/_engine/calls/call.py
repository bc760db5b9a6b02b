"""One host call as the program issued it: the value every step of the call path takes, and its identity."""

from __future__ import annotations

import hashlib
import json
from typing import Any, NamedTuple


class Call(NamedTuple):
    """A host call, numbered and identified: what the boundary replays, checks, journals and sends.

    Built once when the program issues the call (``EffectBoundary.call``) from
    its JSON form, so what is journaled, shown for approval and sent are one
    value (P-26). The tool it resolves to and its validated arguments travel
    beside it: a call to an unknown tool is still a call. Immutable as a
    tuple: a frozen dataclass sets each field through ``object.__setattr__``,
    ~0.4 µs more on every host call (core_bench).
    """

    seq: int  # its number in the order the program issued it (P-5)
    op: str  # "tool", a builtin ("search", "describe", "sources") or a wait ("wait_for", ...)
    address: str  # a tool's address; the op itself for a builtin or a wait
    args: dict[str, Any]  # as journaled: keyword arguments for a tool, {"args", "kwargs"} otherwise
    key: str = ""  # its identity (call_key, P-3): what replay compares
    size: int = 0  # bytes of what identifies it, counted against the journal's limits (P-22)

    def held(self) -> dict[str, Any]:
        """How a call held while the attempt stops is listed (and restored, P-9)."""
        return {"seq": self.seq, "op": self.op, "address": self.address, "args": self.args}


# Built once: json.dumps with options builds a new encoder on each call (same text either way).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no spaces, UTF-8 kept."""
    return _CANONICAL.encode(value)


def call_key(op: str, address: str, args: dict[str, Any]) -> str:
    """The identity of a call: what it does and with which arguments (P-3)."""
    return call_key_and_size(op, address, args)[0]


def call_key_and_size(op: str, address: str, args: dict[str, Any]) -> tuple[str, int]:
    """The call's key and the size in bytes of what identifies it, from one serialization."""
    data = canonical_json([op, address, args]).encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest(), len(data)
