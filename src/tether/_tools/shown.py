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
  after the arguments, never before them;
* a value that is a secret — an argument (or a key of an object argument)
  named like one (``password``, ``api_key``, ``access_token``, ``client_secret``…),
  or marked ``format: password`` or ``writeOnly`` in the tool's schema — is
  shown as ``REDACTED``: :func:`secret_paths` is the one rule every surface
  (pages, forms, pause text, webhooks, the CLI, the console's journal) uses.

Nothing here reads the store or the catalog: callers pass what they show.
"""

from __future__ import annotations

import json
import re
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
# What stands for a secret's value: its length is not shown either (a short PIN is guessable from it).
REDACTED = "[secret, not shown]"
# Words of an argument's name that make its value a secret wherever they stand in the name.
_SECRET_WORDS = frozenset({"password", "passwd", "passphrase", "pwd", "secret", "secrets", "credential",
                           "credentials", "authorization", "cookie", "apikey", "privatekey",
                           # Short ones that are whole words in a name: a card's CVV, a one-time code.
                           "pin", "otp", "cvv", "cvc", "ssn"})
# Words that make a secret only after certain others: "api_key" is one, an object's "key" is not;
# "access_token" is one, "max_tokens" and a pagination "page_token" are not.
_SECRET_PAIRS = {"key": frozenset({"api", "private", "secret", "access", "signing", "encryption", "client",
                                   "master", "ssh", "license"}),
                 "token": frozenset({"", "access", "refresh", "auth", "bearer", "api", "id", "session", "csrf",
                                     "personal", "oauth", "github", "bot", "user", "app", "webhook", "security",
                                     "x"})}
# Words that may follow a secret word and keep it one ("password_confirmation", "secret_value");
# any other ("secret_name", "password_policy", "token_expires_at") names something about the secret.
_SECRET_TAILS = frozenset({"value", "hash", "confirmation", "confirm", "plain", "plaintext", "raw", "new", "old",
                           "current", "b64", "base64", "encrypted", "data", "string", "str", "text"})


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


def _words(name: str) -> list[str]:
    # snake_case, kebab-case, camelCase and dotted names alike: "clientSecret" -> ["client", "secret"].
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.lower()) if w]


def secret_name(name: str) -> bool:
    """Whether an argument or field called ``name`` holds a secret (``password``, ``apiKey``, ``access_token``)."""
    words = _words(str(name))
    for i, word in enumerate(words):
        if not all(w in _SECRET_TAILS for w in words[i + 1:]):
            continue
        before = words[i - 1] if i else ""
        if word in _SECRET_WORDS or (word in _SECRET_PAIRS and before in _SECRET_PAIRS[word]):
            return True
    return False


def _schema_secret(schema: Any) -> bool:
    return isinstance(schema, Mapping) and (schema.get("format") == "password" or schema.get("writeOnly") is True)


def _redact(value: Any, schema: Any, path: tuple[str, ...], found: list[tuple[str, ...]]) -> Any:
    if isinstance(value, Mapping):
        props = schema.get("properties") if isinstance(schema, Mapping) else None
        out = {}
        for key, item in value.items():
            sub = props.get(key) if isinstance(props, Mapping) else None
            if secret_name(str(key)) or _schema_secret(sub):
                found.append((*path, str(key)))
                out[key] = REDACTED
            else:
                out[key] = _redact(item, sub, (*path, str(key)), found)
        return out
    if isinstance(value, (list, tuple)):
        items = schema.get("items") if isinstance(schema, Mapping) else None
        return [_redact(v, items, (*path, str(i)), found) for i, v in enumerate(value)]
    return value


def secret_paths(args: Mapping[str, Any] | None, schema: Mapping[str, Any] | None = None
                 ) -> tuple[dict[str, Any], list[tuple[str, ...]]]:
    """``args`` with every secret value replaced by ``REDACTED``, and the paths of those values.

    A value is a secret when its name says so (:func:`secret_name`), at the top
    level or as a key of an object inside an argument, or when the tool's input
    ``schema`` marks it ``format: password`` or ``writeOnly``. The one rule for
    every surface that shows a call to a person.
    """
    found: list[tuple[str, ...]] = []
    redacted = _redact(dict(args or {}), schema or {}, (), found)
    return redacted, found


def secret_values(args: Mapping[str, Any] | None, schema: Mapping[str, Any] | None = None) -> set[str]:
    """The text of every secret value in ``args`` (see :func:`secret_paths`), for :func:`mask`."""
    out: set[str] = set()
    for path in secret_paths(args, schema)[1]:
        value: Any = args
        for step in path:
            value = value.get(step) if isinstance(value, Mapping) else (
                value[int(step)] if isinstance(value, (list, tuple)) and step.isdigit() and int(step) < len(value)
                else None)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            out.add(str(value))
    return out


def mask(text: str, values: set[str]) -> str:
    """``text`` (a program, a log) with each of ``values`` shown as ``REDACTED``: a secret a call was given
    is not shown where the program spelled it out either. Values under 4 characters are left (too common)."""
    for value in sorted((v for v in values if len(v) >= 4), key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


# A string literal given to a name in source text: `api_key="…"`, `password = '…'`, `"client_secret": "…"`.
_NAMED_LITERAL = re.compile(r"""(?P<name>[A-Za-z_][\w-]*)(?P<q1>["']?)(?P<sep>\s*(?:=|:)\s*)"""
                            r"""(?P<q>[rbuRBU]{0,2}["'])(?P<value>(?:\\.|(?!(?P=q)).)*)(?P=q)""")


def mask_source(text: str) -> str:
    """Program text with the string literal given to each secret-named argument or key as ``REDACTED``:
    ``api_key="sk_…"`` reads ``api_key='[secret, not shown]'``. Values the program computes are not found
    here; :func:`mask` hides the ones a call was given."""
    def hide(m: re.Match[str]) -> str:
        if not secret_name(m.group("name")):
            return m.group(0)
        return f"{m.group('name')}{m.group('q1')}{m.group('sep')}{REDACTED!r}"

    return _NAMED_LITERAL.sub(hide, text)


def redacted(args: Any, schema: Mapping[str, Any] | None = None) -> Any:
    """``args`` as a person may be shown them: secret values replaced (see :func:`secret_paths`)."""
    if not isinstance(args, Mapping):
        return args
    return secret_paths(args, schema)[0]


@dataclass(frozen=True)
class ShownArg:
    """One argument: its name and value, escaped; ``text`` cut to its share of the room, ``full`` whole."""

    name: str
    text: str
    more: int  # characters of the value not in ``text``
    flagged: bool
    full: str  # the whole value, escaped, newlines kept (a page folds it)
    secret: bool = False  # the value is a secret and is shown as REDACTED

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
              budget: int = DEFAULT_BUDGET, schema: Mapping[str, Any] | None = None) -> ShownCall:
    """How the call ``address(**args)`` is shown: values in ``budget`` characters between them.

    ``schema`` is the tool's input schema when the caller has it: its ``format: password`` and
    ``writeOnly`` properties are redacted too (names like ``password`` are, without it).
    """
    safe, paths = secret_paths(args, schema)
    whole_secrets = {p[0] for p in paths if len(p) == 1}
    items = list(safe.items())
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
                              escape(whole, keep_lines=True), str(name) in whole_secrets))
    flagged = suspicious(address) or any(a.flagged for a in shown) or any(suspicious(v) for _, v in rest)
    text = (description or "").strip()
    return ShownCall(escape(address), tuple(shown), len(rest), flagged,
                     escape(text, keep_lines=True) if text else None)


__all__ = ["REDACTED", "ShownArg", "ShownCall", "escape", "mask", "mask_source", "redacted", "secret_name", "secret_paths",
           "secret_values", "show_call", "suspicious"]
