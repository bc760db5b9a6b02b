"""How a tool call is shown to a person who decides it: one pure function for every surface.

The console, an approval link's page, the MCP approval form, the CLI, the
paused envelope's instructions and a webhook's body all show a write through
:func:`show_call`, so none can show less, or other, than the rest:

* every argument is named; when there is not room for every value, the values
  share the room evenly (a short value gives what it does not need to the
  long ones) and each cut value says how many characters were left out; only
  past ``MAX_NAMED_ARGS`` arguments are the rest counted ("N arguments not
  shown") rather than named;
* control characters — bidi overrides and isolates that reorder what is read,
  zero-width characters, C0/C1 controls, terminal escapes — are shown as
  ``\\u202e``-style escapes and the call is flagged, so ``"\\u202e666-REKCATTA"``
  is never read as ``ATTACKER-666``;
* the tool's description, which its server writes and which may be long, comes
  after the arguments, never before them.

Nothing here reads the store or the catalog: callers pass what they show.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from typing import Any, Mapping

# Room for the values of one call in a one-line or message form (the MCP form, instructions, the CLI).
DEFAULT_BUDGET = 600
# Every value shows at least this much of itself, however many arguments share the room.
MIN_VALUE_CHARS = 24
# Past this many arguments the rest are counted, not named: a form stays readable.
MAX_NAMED_ARGS = 40
# The description shown under the arguments in a message form; the pages fold the whole of it.
DESCRIPTION_CHARS = 300
# Unicode categories never shown raw: controls, format characters (bidi, zero-width), surrogates,
# private use, unassigned, and the line and paragraph separators.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
# Ordinary layout: escaped on one line, kept in a block, and never a reason to flag.
_LAYOUT = frozenset("\n\t\r")
FLAG_TEXT = "control characters (e.g. bidi overrides) are shown escaped"


def _escape_char(ch: str) -> str:
    code = ord(ch)
    return {"\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(ch) or (
        f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")


def _hidden(ch: str) -> bool:
    return unicodedata.category(ch) in _HIDDEN


def escape(text: str, *, keep_lines: bool = False) -> str:
    """``text`` with every control or format character written as an escape.

    ``keep_lines`` keeps newlines and tabs as they are (a block of text, a log line).
    """
    if keep_lines:
        return "".join(ch if ch in _LAYOUT or not _hidden(ch) else _escape_char(ch) for ch in text)
    return "".join(_escape_char(ch) if _hidden(ch) else ch for ch in text)


def suspicious(value: Any) -> bool:
    """Whether a value holds a control or format character other than newline, tab and carriage return."""
    if isinstance(value, str):
        return any(ch not in _LAYOUT and _hidden(ch) for ch in value)
    if isinstance(value, Mapping):
        return any(suspicious(k) or suspicious(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(suspicious(v) for v in value)
    return False


def _json(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


@dataclass(frozen=True)
class ShownArg:
    """One argument: its name and value, escaped; ``text`` cut to its share of the room, ``full`` whole."""

    name: str
    text: str
    more: int  # characters of the value not in ``text``
    flagged: bool
    full: str  # the whole value, escaped, newlines kept (a page folds it)

    def inline(self) -> str:
        cut = f" [{self.more} more characters]" if self.more else ""
        return f"{self.name}={self.text}{cut}"


@dataclass(frozen=True)
class ShownCall:
    """A call as a person is shown it, whatever the surface."""

    address: str
    args: tuple[ShownArg, ...]
    not_shown: int  # arguments past MAX_NAMED_ARGS, counted
    flagged: bool
    description: str | None  # escaped, whole; surfaces show it after the arguments

    def line(self) -> str:
        """One line: ``address(a=1, b="x…" [120 more characters], [3 arguments not shown])``."""
        parts = [a.inline() for a in self.args]
        if self.not_shown:
            parts.append(f"[{self.not_shown} arguments not shown]")
        flag = f" [{FLAG_TEXT}]" if self.flagged else ""
        return f"{self.address}({', '.join(parts)}){flag}"

    def block(self, *, describe: bool = True) -> str:
        """Several lines: the address, one argument a line, the flag, then (``describe``) the description."""
        lines = [self.address]
        lines += [f"  {a.inline()}" for a in self.args] or ["  (no arguments)"]
        if self.not_shown:
            lines.append(f"  [{self.not_shown} arguments not shown]")
        if self.flagged:
            lines.append(f"  Note: {FLAG_TEXT}.")
        about = self.about() if describe else None
        return "\n".join(lines + ([about] if about else []))

    def about(self) -> str | None:
        """The tool's description, shortened, for after the arguments; None without one."""
        if not self.description:
            return None
        text = self.description if len(self.description) <= DESCRIPTION_CHARS else (
            self.description[:DESCRIPTION_CHARS] + f"… [{len(self.description) - DESCRIPTION_CHARS} more characters]")
        return f"About {self.address}: {text}"

    def to_dict(self) -> dict[str, Any]:
        """As JSON (a webhook body): every argument named, values shortened and escaped."""
        out: dict[str, Any] = {"address": self.address,
                               "args": [{"name": a.name, "value": a.text, "more_characters": a.more}
                                        for a in self.args],
                               "flagged": self.flagged}
        if self.not_shown:
            out["arguments_not_shown"] = self.not_shown
        return out


def _shares(lengths: list[int], budget: int) -> list[int]:
    """Room per value: each gets what it needs up to an even share; what short ones leave goes to the rest."""
    room = max(budget, MIN_VALUE_CHARS * len(lengths))
    shares = [0] * len(lengths)
    left = sorted(range(len(lengths)), key=lambda i: lengths[i])
    while left:
        even = room // len(left)
        i = left[0]
        if lengths[i] <= even:
            shares[i] = lengths[i]
            room -= lengths[i]
            left.pop(0)
            continue
        for j in left:  # every value left is longer than an even share: all get one
            shares[j] = max(even, MIN_VALUE_CHARS)
        break
    return shares


def show_call(address: str, args: Mapping[str, Any] | None, *, description: str | None = None,
              budget: int = DEFAULT_BUDGET) -> ShownCall:
    """How the call ``address(**args)`` is shown: values in ``budget`` characters between them."""
    items = list((args or {}).items())
    named, rest = items[:MAX_NAMED_ARGS], items[MAX_NAMED_ARGS:]
    texts = [_json(v) for _, v in named]
    shares = _shares([len(t) for t in texts], budget)
    shown = []
    for (name, value), text, share in zip(named, texts, shares):
        cut = text if len(text) <= share else text[:max(share - 1, 1)] + "…"
        more = 0 if len(text) <= share else len(text) - len(cut) + 1
        whole = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2,
                                                                  sort_keys=True, default=str)
        shown.append(ShownArg(escape(str(name)), escape(cut), more, suspicious(name) or suspicious(value),
                              escape(whole, keep_lines=True)))
    flagged = suspicious(address) or any(a.flagged for a in shown) or any(suspicious(v) for _, v in rest)
    text = (description or "").strip()
    return ShownCall(escape(address), tuple(shown), len(rest), flagged,
                     escape(text, keep_lines=True) if text else None)


__all__ = ["ShownArg", "ShownCall", "escape", "show_call", "suspicious"]
