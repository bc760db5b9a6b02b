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
from json.encoder import encode_basestring_ascii as _stored  # a string as the store's JSON writes it
from typing import Any

from tether._engine.lineage.judge import USER_WORDS, Origin
from tether._engine.lineage.values import marks
from tether.errors import InvalidArguments

# Characters of the messages read for marks, and of the marks' stored JSON kept on the run: the user's words travel
# in the run's signed record, which a long pasted text must not swell; what is past it is not trusted (only more
# writes ask).
MAX_CHARS = 65_536
MARKS_CHARS = 16_384
# The run's meta key they are kept under (a signed run field, integrity.signed_run_fields).
FIELD = "user_words"


def messages(words: object) -> Sequence[str] | None:
    """``words`` as a list of messages (None for none given); InvalidArguments for anything but a string or a
    sequence of strings, before any run exists."""
    if words is None:
        return None
    texts = [words] if isinstance(words, str) else words
    if not isinstance(texts, Sequence) or not all(isinstance(t, str) for t in texts):
        raise InvalidArguments(f"user_words is the user's messages, a string or a list of strings, not "
                               f"{type(words).__name__}; no run was started")
    return texts


def record(words: str | Sequence[str] | None, *, guarded: bool = True) -> dict[str, Any] | None:
    """What the run keeps of the user's words (``meta.user_words``): their marks, or None for none given or
    for a run not ``guarded`` (only ``writes = "guard"`` reads them, and other runs compute nothing of it).

    Raises InvalidArguments for anything but a string or a sequence of strings, before any run exists.
    """
    texts = messages(words)
    if texts is None or not guarded:
        return None
    kept: list[list[str]] = []
    room, read = MARKS_CHARS, MAX_CHARS
    seen: set[str] = set()
    # The latest message first: past the bound, what the user said last still counts (a conversation's
    # earliest turns are the ones left out).
    for text in reversed(texts):
        text = text[:read]
        # An empty message counts as one character read: the bound then holds the number of messages scanned
        # too (a million empty ones would otherwise each pay a scan, on the caller's event loop).
        read -= max(len(text), 1)
        for m in marks(text):
            # Windows of prose are the message itself, 256 words of it (D-77): the judge meets a destination with
            # its addresses, links, numbers, quoted values and names, never with eight words of a sentence.
            if m.kind == "text" or m.norm in seen:
                continue
            # What the mark adds to the run's stored JSON (``["kind","norm"],``), as the store spells it: a norm of
            # characters it escapes (``\uXXXX``) weighs six per character, so 16 KiB of one-character quoted
            # values cannot make the signed field 18 times the bound.
            room -= len(_stored(m.kind)) + len(_stored(m.norm)) + 4
            if room < 0:
                break
            seen.add(m.norm)
            kept.append([m.kind, m.norm])
        if read <= 0 or room < 0:
            break
    return {"marks": kept}


def refuse_in_meta(meta: Mapping[str, Any] | None) -> None:
    """Raise InvalidArguments when a run's ``meta`` would carry ``user_words`` itself.

    ``meta`` is recorded on the run as the caller gives it, and a host may fill it from a request or an earlier
    run: the signed field that vouches for destinations is only ever what :func:`record` computes from
    ``user_words=`` (bounded, normalised, under guard alone), never marks handed in whole (D-75).
    """
    if isinstance(meta, Mapping) and FIELD in meta:
        raise InvalidArguments(f"meta cannot carry {FIELD!r}: it is computed from the user_words argument only; "
                               "no run was started",
                               next_action="Pass the user's messages as user_words= and leave the key out of meta.")


def origins(meta: Mapping[str, Any] | None) -> dict[str, Origin]:
    """norm -> its origin, for the judge's trusted values, from a run's ``meta`` (signed, P-35)."""
    held = (meta or {}).get(FIELD)
    items = held.get("marks") if isinstance(held, Mapping) else None
    found: dict[str, Origin] = {}
    for item in items if isinstance(items, list) else ():
        if isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item):
            found.setdefault(item[1], Origin(USER_WORDS, kind=item[0]))
    return found
