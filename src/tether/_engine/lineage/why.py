"""Why a guarded write waits, as a person reads it on every surface (P-45).

One function for the console, the approval link page, the MCP forms, the model's paused result, the CLI,
webhooks and the ``runs show`` timeline: the reasons that made the write ask, each "<argument>: <sentence>",
its characters escaped as the approval screens escape an argument (a reason quotes data an untrusted source
wrote) and the values of the write's secret arguments masked. No surface shows more than ``LINES``.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from tether._tools.shown import escape, mask, secret_values

# Reasons one write shows: a page stays readable, and the first say the most (judge.py orders them).
LINES = 8
# Characters of one line: a quoted value is already shortened by the judge.
WIDTH = 300


def why_lines(reasons: Iterable[Any], args: Mapping[str, Any] | None = None) -> list[str]:
    """The reasons that made a write ask, one line each; empty when none did (a rule or the mode asked)."""
    hidden = secret_values(args) if args else set()
    out = []
    for reason in reasons:
        if not isinstance(reason, Mapping) or not reason.get("asks"):
            continue
        line = f"{reason.get('arg')}: {reason.get('says')}"
        line = escape(mask(line, hidden))
        out.append(line if len(line) <= WIDTH else line[:WIDTH - 1] + "…")
        if len(out) == LINES:
            break
    return out


def why_text(reasons: Iterable[Any], args: Mapping[str, Any] | None = None, *, lead: str = "Why it asks: ") -> str:
    """:func:`why_lines` as one sentence for a form or a message ("" when nothing asked)."""
    lines = why_lines(reasons, args)
    return lead + "; ".join(lines) + "." if lines else ""
