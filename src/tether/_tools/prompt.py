"""The text an agent reads to learn the in-sandbox API.

It sits in every conversation that uses tether, so it is terse and bounded:
the API, the honest gaps of the Python subset, the limits, then every
namespace with its tool count and a one-line summary (an OpenAPI document's
title, an MCP server's name and instructions, a Python module's docstring),
summaries shortened evenly until all fit the byte budget. Past what fits
even without summaries, the namespaces with the most tools come first and
the rest are counted, with a pointer to ``sources()``. The same catalog
always gives the same bytes, whatever order its tools were added in, so
prompt caches keep hitting.
"""

from __future__ import annotations

from typing import Any, Mapping

from tether._tools.catalog import Catalog

# 1,200 bytes ≈ 300 tokens: small next to a conversation, enough for the API
# and a handful of namespaces; search()/sources() reveal the rest on demand.
DEFAULT_BUDGET = 1200
# A summary is a hint, not documentation: never longer than this, and
# shortened further (evenly) until every namespace fits.
_MAX_SUMMARY_BYTES = 90
# Below this a summary says nothing; the namespaces are then listed by name.
_MIN_SUMMARY_BYTES = 16

# Defaults match tether._engine.rules.limits.Limits, used when no limits are given.
_DEFAULT_LIMITS = {"code_bytes": 65536, "host_calls": 50, "run_seconds": 60}

_API = """\
Write one Python program (sandboxed subset, top-level await): `import tools`, \
`await tools.ns.tool(a, k=v)` (async; args by position or keyword, as describe() shows); \
parallel: `await asyncio.gather(f(), g())`. Built-ins: `await search(query, namespace=None, limit=12, offset=0)`, \
`await describe(address or list)`, `await sources()`, emit(v) streams, `await wait_for(name)` parks. \
The last expression is the result; print() goes to logs. A failing tool raises, message starts with [code]; \
writes may pause for approval.
No: custom exceptions, super(), generators, del, @property/staticmethod/classmethod, \
asyncio.wait_for, gather(return_exceptions=), ConnectionError, files, network, env.
Modules: asyncio base64 bisect collections copy csv dataclasses datetime decimal functools \
hashlib itertools json math random re statistics time tomllib typing unicodedata.
"""


# The last line of execute's description (P-36): a request whose reply was lost is retried, not run again.
KEY_NOTE = ("Pass a new `key` per program; if a reply is lost, call again with the same key and code: "
            "you get that run, never a second one.")


def execute_description(catalog: Catalog, limits: Mapping[str, Any] | None = None) -> str:
    """What the ``execute`` tool says: the model description, then how to retry, within the same budget."""
    note = KEY_NOTE + "\n"
    return model_description(catalog, limits, budget=DEFAULT_BUDGET - len(note.encode())) + note


def model_description(
    catalog: Catalog, limits: Mapping[str, Any] | None = None, *, budget: int = DEFAULT_BUDGET
) -> str:
    """The model-facing description of the sandbox API and the catalog.

    ``limits`` takes the keys of ``tether._engine.rules.limits.Limits.to_dict()``
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
        # A colon introduces the list; with no tools there is none, and the line ends as a sentence.
        + f"{_count(len(namespaces), 'namespace')}, {_count(total_tools, 'tool')}{':' if namespaces else '.'}\n"
    )
    # Most tools first: with a truncated list, they are the likeliest to matter.
    ordered = sorted(namespaces, key=lambda ns: (-ns["tools"], ns["namespace"]))
    return head + _inventory(ordered, budget - len(head.encode()))


def _inventory(ordered: list[dict[str, Any]], room: int) -> str:
    """One line per namespace within ``room`` bytes: summaries shortened evenly, else names only."""
    labels = [f"{ns['namespace']} ({ns['tools']})" for ns in ordered]
    summaries = [" ".join(str(ns["summary"] or "").split()) for ns in ordered]
    # Every line is "label: summary\n"; the summaries share what the labels leave.
    fixed = sum(len(label.encode()) + 3 for label in labels)
    caps = _share(room - fixed, [min(len(s.encode()), _MAX_SUMMARY_BYTES) for s in summaries])
    if caps is not None:
        return "".join(
            f"{label}: {_clip(summary, cap)}\n" if cap else f"{label}\n"
            for label, summary, cap in zip(labels, summaries, caps)
        )
    # Not even a short summary each: names, most tools first, and a count of the rest.
    shown: list[str] = []
    used = 0
    for i, label in enumerate(labels):
        rest = len(labels) - i - 1
        size = len(label.encode()) + 2
        if used + size + (len(_more(rest).encode()) if rest else 0) > room:
            break
        shown.append(label)
        used += size
    hidden = len(labels) - len(shown)
    return ", ".join(shown) + ("\n" if shown else "") + (_more(hidden) if hidden else "")


def _share(room: int, wants: list[int]) -> list[int] | None:
    """Byte caps for summaries wanting ``wants`` bytes in ``room``: short ones whole, long ones evenly cut.

    ``None`` when the room cannot give every summary that wants one at least
    ``_MIN_SUMMARY_BYTES``.
    """
    caps = [0] * len(wants)
    order = sorted(range(len(wants)), key=lambda i: (wants[i], i))
    left = room
    for k, i in enumerate(order):
        even = left // (len(order) - k)
        caps[i] = min(wants[i], even)
        if wants[i] and caps[i] < min(wants[i], _MIN_SUMMARY_BYTES):
            return None
        left -= caps[i]
    return caps


def _more(count: int) -> str:
    return f"… and {count} more namespaces: call sources()\n"


def _seconds(value: Any) -> str:
    return f"{float(value):g}"


def _clip(text: str, limit: int) -> str:
    data = text.encode()
    if len(data) <= limit:
        return text
    # Cut on a character boundary, never inside a multi-byte sequence.
    return data[: max(0, limit - 3)].decode(errors="ignore").rstrip() + "…"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
