"""Run state integrity: what a resume or replay acts on is signed, and checked before use (P-35).

Three kinds of MAC, all HMAC-SHA256 under the store's signing secret and all
tagged with the id of the secret that made them, so a store can rotate its
secret and keep old runs verifiable, and so a process holding the wrong
secret can say so instead of reporting tampering:

- the **run MAC** (``runs.mac``): one MAC per field of :func:`signed_run_fields`
  that is not None (a None field is signed by its absence, D-51), so a mismatch
  names the field (never its value), and one over the names of those fields
  (format 2, D-55), so removing a field's MAC is refused too;
- the **call MAC** (``calls.mac``): each journal entry's identity, state and
  outcome, chained to the key of the call before it;
- the **snapshot MAC** (``snapshots.mac``): the dump and the calls it waits on.

Nothing here reads or writes the store: callers pass records in, and the
journal's entries are written, signed with these MACs, by the one writer of
call rows (tether._engine.calls.ledger).
"""

from __future__ import annotations

import hashlib
import weakref
from json.encoder import encode_basestring_ascii
from typing import TYPE_CHECKING, Any, Sequence

from tether._engine.approvals.capabilities import Keyring, canonical_text, mac_hex, same
from tether._store.base import escapes_alike
from tether.errors import RunTampered

if TYPE_CHECKING:
    from tether._store.base import CallRecord, RunRecord, SnapshotRecord

_FIELD_HEX = 32  # 128 bits per run field: forging one is as hard as forging the whole


# ---------------------------------------------------------------------------
# Runs


# Fields no run is ever without (signed since the first run signature): a format-1 signature missing one of
# their MACs was edited (D-55).
_ALWAYS_SIGNED = ("program", "environment", "policy", "limits")

def signed_run_fields(run: "RunRecord") -> list[tuple[str, Any]]:
    """Every field of a run that a resume, a replay or ``tether resume``'s setup acts on, by name.

    The run MAC is computed over exactly this list, one MAC per entry, so a
    mismatch names the field. To sign a new field add one line here, e.g.
    ``("meta.sources", meta.get("sources"))``; runs signed before the field
    existed still verify while it is None on them. Never remove a line: a run
    signed in format 2 signs the names of its fields with a MAC (D-55), and
    one whose name was removed would no longer verify; keep it, None from then on.

    Not signed, on purpose: status, owner, lease and timestamps (compare-and-set
    guards them, and they decide nothing a resume sends), the result envelope,
    and the record of decisions (``decision``, ``meta.decisions``): a decision
    takes effect through the journal entry it moves from ``asked`` to
    ``approved`` or ``declined``, and that entry's MAC covers its state.
    """
    meta = run.meta or {}
    return [
        ("principal", run.principal),
        ("session", run.session),
        ("program", run.program),
        ("environment", run.environment),
        ("policy", run.policy),
        ("limits", run.limits),
        ("meta.tools", meta.get("tools")),
        ("meta.config", meta.get("config")),
        ("meta.type_check", meta.get("type_check")),
        ("meta.session_base", meta.get("session_base")),
        ("meta.sources", meta.get("sources")),  # the source definitions a run travels with (P-30)
        ("meta.client", meta.get("client")),  # the MCP client that asked, as approvers are shown it
        ("meta.user_words", meta.get("user_words")),  # what guard trusts as the user's own words (D-75)
        ("pending", run.pending),
        ("expires_at", run.expires_at),
    ]


class _SignedHere(dict[str, Any]):
    """A run MAC as :func:`sign_run` made it for one record object in this process (D-45).

    Stored, it is the plain dict it holds (the store keeps no Python type); read back, a record's MAC is a
    plain dict and is verified in full. Kept with it: the record it was made for and the very values it
    covers, so a record given another value for a signed field after signing is verified in full too.
    """

    __slots__ = ("record", "signed")

    def __init__(self, mac: dict[str, Any], run: "RunRecord", values: list[Any]) -> None:
        super().__init__(mac)
        self.record = weakref.ref(run)
        self.signed = values  # held, not their ids: an id is reused once its object is gone


# The run signature's formats (D-55). 1: one MAC per field over ``["run", run_id, name, value]`` and nothing over
# which fields carry one (runs signed before D-55 verify so, until they end). 2: every MAC's signed bytes begin
# ``["run", 2, run_id`` — so no MAC of format 2 verifies as one of format 1 — and one more MAC, under the name
# ``*`` (no field's name), covers the names of the fields that carry a MAC: sorted, joined by commas (no name
# holds one), a string, which the MACs' encoder writes without a Python call (a list cost ~1.3 µs more).
RUN_SIGNATURES = (1, 2)
_NAMES = "*"
_LOST_SEARCH = 1 << 12  # sets of dropped names tried when naming them: only a refused run pays for it


def _head(run_id: str, version: int) -> tuple[Any, ...]:
    return ("run", run_id) if version == 1 else ("run", 2, run_id)


def sign_run(keyring: Keyring, run: "RunRecord", version: int = 2) -> dict[str, Any]:
    """The run's MAC in format ``version`` (``[store] run_signature``; 2 unless a rolling upgrade asks for 1)."""
    signed = signed_run_fields(run)
    # A field that is None is signed by its absence (D-51); in format 2 the MAC over the names of the fields
    # that carry one says which are absent (D-55). Most of a plain run's 14 fields are None.
    valued = [(name, value) for name, value in signed if value is not None]
    tails = valued if version == 1 else [*valued, (_NAMES, ",".join(sorted(name for name, _ in valued)))]
    macs = Keyring.macs(keyring.current, _head(run.run_id, version), tails)
    fields = {name: mac[:_FIELD_HEX] for (name, _), mac in zip(valued, macs)}
    mac: dict[str, Any] = {"secret_id": keyring.current_id, "fields": fields}
    if version != 1:
        mac["format"] = version
        mac["names"] = macs[-1][:_FIELD_HEX]
    return _SignedHere(mac, run, [v for _, v in signed])


def _signed_here(run: "RunRecord", mac: Any) -> bool:
    """Whether ``mac`` is the one this process made for this record object, over the values it holds now."""
    if type(mac) is not _SignedHere or mac.record() is not run:
        return False
    now = signed_run_fields(run)
    return len(now) == len(mac.signed) and all(v is held for (_, v), held in zip(now, mac.signed))


def verify_run(keyring: Keyring, run: "RunRecord") -> None:
    """Raise ``RunTampered`` (naming the fields) or ``WrongSecret``; return when every field verifies.

    A record this process signed and never read back is not checked again (D-45): its fields are the
    values signed microseconds before, in memory, where no one but this process can change them. Every
    record read from the store (what a resume, a replay or a worker's claim acts on) is checked in full.
    """
    mac = getattr(run, "mac", None)
    if _signed_here(run, mac):
        return
    if not isinstance(mac, dict) or not isinstance(mac.get("fields"), dict) or not isinstance(mac.get("secret_id"), str):
        raise RunTampered(
            f"run {run.run_id} carries no valid signature (its mac is missing: recorded by a tether without run "
            "signatures, or the signature was removed); nothing was resumed or sent",
            details={"fields": ["mac"]},
        )
    if mac.get("format", 1) not in RUN_SIGNATURES:
        raise RunTampered(
            f"run {run.run_id} carries a run signature of format {str(mac.get('format'))[:20]}, which this tether "
            f"does not know (it verifies formats {', '.join(map(str, RUN_SIGNATURES))}); nothing was resumed or sent",
            details={"fields": ["mac"]},
        )
    version = mac.get("format", 1)
    key = keyring.key_for(mac["secret_id"], f"run {run.run_id}")
    stored = mac["fields"]
    signed = signed_run_fields(run)
    head = _head(run.run_id, version)
    # A field without a MAC must be None (D-51: a None field is signed by its absence; a run signed before
    # the field existed has none); one with a MAC must match it, None or not.
    macced = [(name, value) for name, value in signed if name in stored]
    wrong = {name for name, value in signed if name not in stored and value is not None}
    # The names of signed fields only, not every key of the stored MAC: a key of its own such as "limits,policy"
    # would spell the same joined names as two fields whose MACs were removed.
    names = sorted(name for name, _ in macced)
    tails = macced if version == 1 else [*macced, (_NAMES, ",".join(names))]
    expected = Keyring.macs(key, head, tails)
    for (name, _), digest in zip(macced, expected):
        if not isinstance(stored[name], str) or not same(digest[:_FIELD_HEX], stored[name]):
            wrong.add(name)
    if version == 1:
        # Format 1 signs no set of fields (its gap, kept for the runs signed so until they end), but every run
        # ever signed has a program, an environment, a policy and limits, each with its MAC: without one this
        # is no run format 1 signed — e.g. a run of format 2 whose MACs were removed and its fields set to None
        # to pass it off as format 1 (D-55) — and a resume would act on None where they are always a value.
        wrong.update(name for name in _ALWAYS_SIGNED if name not in stored)
    elif not isinstance(mac.get("names"), str) or not same(expected[-1][:_FIELD_HEX], mac["names"]):
        wrong.update(_lost(key, head, mac.get("names"), names, [n for n, v in signed if n not in stored and v is None]))
    bad = [name for name, _ in signed if name in wrong] + (["mac"] if "mac" in wrong else [])
    if bad:
        raise RunTampered(
            f"run {run.run_id} was changed outside tether: {', '.join(bad)} no longer match"
            f"{'es' if len(bad) == 1 else ''} the run's signature; nothing was resumed or sent",
            details={"fields": bad},
        )


def _lost(key: bytes, head: tuple[Any, ...], names_mac: Any, present: list[str], absent: list[str]) -> list[str]:
    """The fields whose MACs were removed (each set to None), found by which names the names MAC was made over;
    ``["mac"]`` when no such set is found (the names MAC itself was changed or removed).

    Fewest first, so one dropped field costs a MAC per absent field; only a refused run gets here.
    """
    import itertools

    if isinstance(names_mac, str):
        tried = 0
        for size in range(1, len(absent) + 1):
            for dropped in itertools.combinations(absent, size):
                tried += 1
                if tried > _LOST_SEARCH:
                    return ["mac"]
                digest = Keyring.mac(key, *head, _NAMES, ",".join(sorted([*present, *dropped])))
                if same(digest[:_FIELD_HEX], names_mac):
                    return list(dropped)
    return ["mac"]


# ---------------------------------------------------------------------------
# Journal entries


# The signed fields of an entry that change after it is recorded.
_MUTABLE_CALL_FIELDS = ("state", "outcome", "error", "idempotency_key", "sends")


def signed_call_fields(call: "CallRecord") -> list[Any]:
    """What a call's MAC covers: everything replay answers from or decides by (P-5), and what a send carries.

    Add a journal field that a resume acts on here, in one line, and in :func:`_call_message` (the same
    list spelled out; a test fails until both agree).
    """
    fields = [call.run_id, call.seq, call.op, call.address, call.args, call.key, call.kind, call.state,
              call.outcome, call.error, call.idempotency_key, call.sends]
    if call.lineage is not None:
        # Only when set: an entry recorded without lineage keeps its signature (P-45).
        fields.append(call.lineage)
    return fields


def sign_call(keyring: Keyring, call: "CallRecord", prev_key: str | None,
              texts: dict[str, tuple[Any, str]] | None = None) -> str:
    """``<secret id>:<prev>:<hex>``: the MAC chains to the key of the call before (``-`` when not known).

    ``texts``: the entry's JSON fields already spelled (:func:`call_texts`), as ``(the value, its text)`` —
    the MAC is put together from them instead of encoding the entry again (the same bytes).
    """
    prev = (prev_key or "-")[:16]
    if not texts:
        return f"{keyring.current_id}:{prev}:{Keyring.mac(keyring.current, 'call', prev, *signed_call_fields(call))}"
    return f"{keyring.current_id}:{prev}:{mac_hex(keyring.current, _call_message(prev, call, texts))}"


def call_texts(call: "CallRecord", held: dict[str, tuple[Any, str]] | None = None) -> dict[str, tuple[Any, str]]:
    """Each JSON field of ``call`` that holds a value, as ``(the value, its text)``, the text spelled as both
    the entry's MAC and the store's JSON columns spell it (sorted keys, no spaces, ASCII escapes): the writer
    (the ledger) signs the entry from these texts and its row takes them (``CallRecord.texts``), so each
    value is encoded once between the two, and the row holds the bytes that were signed.

    ``held``: texts made earlier of the same values (the call boundary's, which keep UTF-8), taken where
    they are that very value and spelled alike (:func:`escapes_alike`); any other field is encoded here.
    """
    out: dict[str, tuple[Any, str]] = {}
    for name, value in (("args", call.args), ("outcome", call.outcome), ("error", call.error)):
        if value is None:
            continue
        text = held.get(name) if held else None
        out[name] = text if text is not None and text[0] is value and escapes_alike(text[1]) else (
            value, canonical_text(value))
    return out


def _spelled(value: Any) -> str:
    """One signed field as :meth:`Keyring.mac`'s encoder spells it inside its list, without the encoder's
    Python call for a string (a ``CallState`` too: the encoder writes a ``str`` subclass as its text), an int or
    None."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return encode_basestring_ascii(value)
    if type(value) is int:
        return int.__repr__(value)
    return canonical_text(value)


def _taken(texts: dict[str, tuple[Any, str]], name: str, value: Any) -> str:
    held = texts.get(name)
    return held[1] if held is not None and held[0] is value else _spelled(value)


def _call_message(prev: str, call: "CallRecord", texts: dict[str, tuple[Any, str]]) -> bytes:
    """What :meth:`Keyring.mac` signs for ``call``, byte for byte: the canonical JSON of the list
    ``["call", prev, *signed_call_fields(call)]``, which is its items' texts between commas, with ``args``,
    ``outcome`` and ``error`` taken from ``texts`` while the entry still holds that very value (else encoded
    here). A held text must be spelled as the MAC's encoder spells it: :func:`call_texts` makes them so.

    Spelled out field by field, not looped over :func:`signed_call_fields`: a loop's per-field Python cost
    was as much as the one encode it replaces. ``tests/engine/test_journal_texts.py`` holds the two equal.
    """
    s = _spelled
    return (f'["call",{s(prev)},{s(call.run_id)},{s(call.seq)},{s(call.op)},{s(call.address)},'
            f'{_taken(texts, "args", call.args)},{s(call.key)},{s(call.kind)},{s(call.state)},'
            f'{_taken(texts, "outcome", call.outcome)},{_taken(texts, "error", call.error)},'
            f'{s(call.idempotency_key)},{s(call.sends)}'
            f'{"" if call.lineage is None else "," + canonical_text(call.lineage)}]').encode()


def resign_call(keyring: Keyring, call: "CallRecord", **fields: Any) -> str:
    """The MAC of ``call`` once ``fields`` are applied, keeping the link it was first signed with."""
    import dataclasses

    parts = call.mac.split(":") if isinstance(call.mac, str) else []
    prev = parts[1] if len(parts) == 3 else "-"
    known = {f.name for f in dataclasses.fields(call)}
    return sign_call(keyring, dataclasses.replace(call, **{k: v for k, v in fields.items() if k in known}),
                     None if prev == "-" else prev)


def signed_update(keyring: Keyring, entry: "CallRecord", **fields: Any) -> dict[str, Any]:
    """What a move of ``entry`` writes (tether._engine.calls.ledger): every signed field that can change,
    with ``fields`` applied, and the new MAC (``mac``)."""
    fields = {**{name: getattr(entry, name) for name in _MUTABLE_CALL_FIELDS}, **fields}
    return {**fields, "mac": resign_call(keyring, entry, **fields)}


def verify_calls(keyring: Keyring, run_id: str, calls: Sequence["CallRecord"]) -> None:
    """Check each entry's MAC and its link to the entry before it (when that one is at hand)."""
    by_seq = {c.seq: c for c in calls}
    for call in calls:
        mac = getattr(call, "mac", None)
        parts = mac.split(":") if isinstance(mac, str) else []
        if len(parts) != 3:
            raise RunTampered(f"journal[{call.seq}] (the entry of call {call.seq}) of run {run_id} carries no valid "
                              "signature; nothing was resumed or sent", details={"fields": [f"journal[{call.seq}]"]})
        sid, prev, digest = parts
        key = keyring.key_for(sid, f"the journal of run {run_id}")
        expected = Keyring.mac(key, "call", prev, *signed_call_fields(call))
        before = by_seq.get(call.seq - 1)
        linked = prev == "-" or before is None or before.key[:16] == prev
        if not same(expected, digest) or not linked:
            raise RunTampered(f"journal[{call.seq}] (the entry of call {call.seq}) of run {run_id} was changed "
                              "outside tether; nothing was resumed or sent", details={"fields": [f"journal[{call.seq}]"]})


# ---------------------------------------------------------------------------
# Snapshots


def sign_snapshot_record(keyring: Keyring, run_id: str, seq: int, version: str, data: bytes,
                         pending: list[dict[str, Any]], kind: str) -> str:
    digest = hashlib.sha256(data).hexdigest()
    return f"{keyring.current_id}:{Keyring.mac(keyring.current, 'snapshot', run_id, seq, version, digest, pending, kind)}"


def verify_snapshot_record(keyring: Keyring, snap: "SnapshotRecord") -> bool:
    """True if it verifies; False if changed; ``WrongSecret`` if signed under a key not held."""
    sid, _, digest = snap.mac.partition(":") if isinstance(snap.mac, str) else ("", "", "")
    if not digest:
        return False
    key = keyring.key_for(sid, f"the snapshot of run {snap.run_id}")
    expected = Keyring.mac(key, "snapshot", snap.run_id, snap.seq, snap.monty_version,
                           hashlib.sha256(snap.data).hexdigest(), snap.pending, snap.kind)
    return same(expected, digest)


__all__ = [
    "call_texts",
    "resign_call",
    "sign_call",
    "sign_run",
    "sign_snapshot_record",
    "signed_call_fields",
    "signed_run_fields",
    "verify_calls",
    "verify_run",
    "verify_snapshot_record",
]
