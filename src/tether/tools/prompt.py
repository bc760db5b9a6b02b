"""The text an agent reads to learn the in-sandbox API.

It sits in every conversation that uses tether, so it is terse and bounded:
the API, the honest gaps of the Python subset, the limits, then as many
namespaces as fit the byte budget (largest first) and a pointer to
``sources()`` for the rest. The same catalog always gives the same bytes,
whatever order its tools were added in, so prompt caches keep hitting.
"""

from __future__ import annotations

from typing import Any, Mapping

from .catalog import Catalog

# 1,200 bytes ≈ 300 tokens: small next to a conversation, enough for the API
# and a handful of namespaces; search()/sources() reveal the rest on demand.
DEFAULT_BUDGET = 1200
# A summary is a hint, not documentation.
_MAX_SUMMARY_BYTES = 60

# Defaults match tether.runs.limits.Limits, used when no limits are given.
_DEFAULT_LIMITS = {"code_bytes": 65536, "host_calls": 50, "run_seconds": 60}

_API = """\
Write one Python program (sandboxed subset, top-level await). `import tools`, call \
`await tools.ns.tool(a, k=v)` (all async; args by position or keyword, as describe() shows). Parallel: `await asyncio.gather(f(), g())`. \
Built-ins: `await search(query, namespace=None, limit=12, offset=0)` ranks tools; \
`await describe(address or list)` gives signatures; `await sources()` lists namespaces. \
Code is type-checked first. The last expression is the result; print() goes to logs. \
A failing tool raises; its message starts with [code]. Writes may pause for approval.
Also: emit(v) streams output; `await wait_for(name)` parks until resolved.
Unsupported: class inheritance/custom exceptions, generators, del, @property/staticmethod/classmethod, \
create_task, asyncio.wait_for, gather(return_exceptions=), files, network, env.
Modules: asyncio base64 bisect collections copy csv dataclasses datetime decimal functools \
hashlib itertools json math random re time tomllib typing unicodedata.
"""


def model_description(
    catalog: Catalog, limits: Mapping[str, Any] | None = None, *, budget: int = DEFAULT_BUDGET
) -> str:
    """The model-facing description of the sandbox API and the catalog.

    ``limits`` takes the keys of ``tether.runs.limits.Limits.to_dict()``
    (``code_bytes``, ``host_calls``, ``run_seconds``); missing keys use its
    defaults. The text is at most ``budget`` bytes of UTF-8 unless the fixed
    part alone is longer, and is byte-identical for equal catalogs.
    """
    lim = {**_DEFAULT_LIMITS, **{k: v for k, v in (limits or {}).items() if v is not None}}
    namespaces = catalog.namespaces()
    total_tools = sum(ns["tools"] for ns in namespaces)
    head = (
        _API
        + f"Limits: {lim['code_bytes']} B code, {lim['host_calls']} calls, {_seconds(lim['run_seconds'])} s.\n"
        + f"{len(namespaces)} namespaces, {total_tools} tools:\n"
    )
    # Largest namespaces first: with a truncated list, they are the likeliest to matter.
    ordered = sorted(namespaces, key=lambda ns: (-ns["tools"], ns["namespace"]))
    lines = [f"{ns['namespace']} ({ns['tools']}): {_clip(ns['summary'])}\n" for ns in ordered]
    used = len(head.encode())
    shown: list[str] = []
    for i, line in enumerate(lines):
        rest = len(lines) - i - 1
        tail = len(_more(rest).encode()) if rest else 0
        size = len(line.encode())
        if used + size + tail > budget:
            break
        shown.append(line)
        used += size
    hidden = len(lines) - len(shown)
    return head + "".join(shown) + (_more(hidden) if hidden else "")


def _more(count: int) -> str:
    return f"… and {count} more namespaces — use sources()\n"


def _seconds(value: Any) -> str:
    return f"{float(value):g}"


def _clip(text: str) -> str:
    data = " ".join(text.split()).encode()
    if len(data) <= _MAX_SUMMARY_BYTES:
        return data.decode()
    # Cut on a character boundary, never inside a multi-byte sequence.
    return data[: _MAX_SUMMARY_BYTES - 3].decode(errors="ignore").rstrip() + "…"
