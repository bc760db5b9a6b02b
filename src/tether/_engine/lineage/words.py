"""The user's words: what the person a run serves wrote, as a trusted source of values (D-75, P-48).

A framework host knows what its user typed ("pay Jane at DE89 3704 0044 0532 0130 00"); tether does not, so
an address the user typed that an untrusted result also holds (the same IBAN in a bill, the same address in
the inbox) looks copied from the result, and under ``writes = "guard"`` it asks. The host may hand tether the
user's messages with the run (``Runtime.execute(..., user_words=...)``, the framework adapters); their marks
are kept on the run, signed with it, and count as a trusted result's values: a destination they hold goes,
as one the user's contacts hold does (the selection limit still applies).

Only the operator's code can give them. No door the agent reaches (MCP, the console's APIs, a tool call's
arguments) carries them: words the agent could set would let it vouch for the address it was told to use.
What a host puts in a user message is the host's call; one that pastes a retrieved document into it trusts
that document (docs/security.md, "Lineage").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tether._engine.lineage.judge import USER_WORDS, Origin
from tether._engine.lineage.values import marks
from tether.errors import InvalidArguments

# Characters of the messages read for marks, and of marks kept on the run: the user's words travel in the run's
# signed record, which a long pasted text must not swell; what is past it is not trusted (only more writes ask).
MAX_CHARS = 65_536
MARKS_CHARS = 16_384


def record(words: str | Sequence[str] | None, *, guarded: bool = True) -> dict[str, Any] | None:
    """What the run keeps of the user's words (``meta.user_words``): their marks, or None for none given or
    for a run not ``guarded`` (only ``writes = "guard"`` reads them, and other runs compute nothing of it).

    Raises InvalidArguments for anything but a string or a sequence of strings, before any run exists.
    """
    if words is None:
        return None
    texts = [words] if isinstance(words, str) else words
    if not isinstance(texts, Sequence) or not all(isinstance(t, str) for t in texts):
        raise InvalidArguments(f"user_words is the user's messages, a string or a list of strings, not "
                               f"{type(words).__name__}; no run was started")
    if not guarded:
        return None
    kept: list[list[str]] = []
    room, read = MARKS_CHARS, MAX_CHARS
    seen: set[str] = set()
    # The latest message first: past the bound, what the user said last still counts (a conversation's
    # earliest turns are the ones left out).
    for text in reversed(texts):
        text = text[:read]
        read -= len(text)
        for m in marks(text):
            if m.norm in seen:
                continue
            room -= len(m.norm)
            if room < 0:
                break
            seen.add(m.norm)
            kept.append([m.kind, m.norm])
        if read <= 0 or room < 0:
            break
    return {"marks": kept}


def origins(meta: Mapping[str, Any] | None) -> dict[str, Origin]:
    """norm -> its origin, for the judge's trusted values, from a run's ``meta`` (signed, P-35)."""
    held = (meta or {}).get("user_words")
    items = held.get("marks") if isinstance(held, Mapping) else None
    found: dict[str, Origin] = {}
    for item in items if isinstance(items, list) else ():
        if isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
            found.setdefault(item[1], Origin(USER_WORDS, kind=item[0]))
    return found
