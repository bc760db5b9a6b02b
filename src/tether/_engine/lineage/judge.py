"""Must a person see this write, and why: the pure decision of the ``guard`` mode (D-63).

Each destination of a call — a destination argument (roles.py), or a link, address or IBAN inside a
content argument — is judged on its own, in this order:

1. on the allowlist (exact, or a glob such as ``*@example.com``): it may go — the operator's word.
2. the static pass traces it to an untrusted tool this run called: ask — unless the value is a literal of
   the program matching no untrusted mark (a program is fixed before any result of its run arrives, so its
   literals cannot carry them; an earlier run's value matches a mark), or a trusted result holds it and no
   untrusted result does (the trace could then only have picked among the user's own destinations: another
   call site of the same tool, an index computed from untrusted data — the selection limit of step 3).
3. its value matches a mark of an untrusted result (this run's or this principal's recent runs'; a literal
   of the program only an earlier run's, for the reason above): ask — unless a trusted result holds the
   same value too (the attacker could then only pick among destinations the user's trusted sources hold:
   the selection limit docs/security.md states).
4. the run read an untrusted result and a literal of the program, a trusted result or the allowlist does
   not hold the value: ask, "never seen in this conversation" — when the static pass cannot tell, or traces
   it to no result at all (a value rebuilt from untrusted data by comparisons, an implicit flow).
5. otherwise it may go, and the reason says what holds it: the program's literals, a trusted result,
   results not marked untrusted, or the program's own computation.

A value with nothing to match (a short number, a word: values.is_low_entropy) is matched only against values
an untrusted text quoted ("the file with ID '13'") and is otherwise judged by the static pass. A content argument never asks by itself. Every destination looked at gets a :class:`Reason` with the
sentence a person reads, whether it asks or not.
"""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from tether._engine.lineage.flow import DataFlow
from tether._engine.lineage.roles import DESTINATION, destinations_in, roles
from tether._engine.lineage.values import Mark, host_of, marks, normalise

# A call with more arguments than this, or a list longer, is judged on its first ones plus "cannot tell" for
# the rest: the reasons a person reads must fit a page, and the work must stay bounded.
MAX_ARGS = 64
MAX_UNITS = 16  # reasons shown per argument that need not ask (every one that asks is shown)
# Values judged per argument: a list's items, the links and addresses in a body, read in slices of the text so a
# link placed after many others, or deep in a long body, is judged too. Past it, what is left asks once the run
# read an untrusted result.
MAX_JUDGED = 1024
_SLICE = 8_192
_OVERLAP = 2_100  # a link is at most about 2 KiB (values._URL), so one cut by a slice's end is whole in the next
MAX_TEXT = 131_072
_SHORT = 512  # a destination string this short is also read without its spaces and percent-decoded
# Characters one judgement scans for marks, all arguments together: the bound on its work.
MAX_SCANNED = 131_072
MAX_REASONS = 128
_SHOWN = 120  # characters of a value a reason quotes

_KIND_WORDS = {
    "email": "the e-mail address", "url": "the link", "host": "the host", "iban": "the IBAN",
    "phone": "the phone number", "id": "the identifier", "text": "the text", "name": "the name",
}
# The pseudo address the user's words (words.py, D-75) are held by, as a trusted result's values are by its tool
# (no namespace can be spelt so).
USER_WORDS = "__user__.words"
_FIELD = re.compile(r"(?:\.([^.\[\]]+)|\[(?:'([^']*)'|\"([^\"]*)\")\])$")


@dataclass(frozen=True)
class Origin:
    """Where an untrusted value was seen: a call of a run, and where in its result."""

    address: str  # "mail.get_received_emails"
    run_id: str = ""
    seq: int | None = None  # the call's number in its run
    path: str = ""  # where in the result: "[0].body"
    kind: str = ""  # the mark's kind, when matched by value

    def to_dict(self) -> dict[str, Any]:
        return {"address": self.address, "run_id": self.run_id, "seq": self.seq, "path": self.path,
                "kind": self.kind}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Origin":
        seq = data.get("seq")
        return cls(str(data.get("address", "")), str(data.get("run_id") or ""),
                   seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
                   str(data.get("path") or ""), str(data.get("kind") or ""))


@dataclass(frozen=True)
class Reason:
    """Why one destination asks, or why it need not."""

    arg: str  # argument name, "recipients[1]", or "body → link" for a destination inside content
    says: str  # the sentence a person reads
    origin: dict[str, Any] | None  # Origin.to_dict() of the untrusted value, if any
    untrusted: bool  # the value comes, or may come, from an untrusted result
    asks: bool = False  # this destination alone makes the write wait for a person
    value: str = ""  # the value judged, shortened

    def to_dict(self) -> dict[str, Any]:
        return {"arg": self.arg, "says": self.says, "origin": self.origin, "untrusted": self.untrusted,
                "asks": self.asks, "value": self.value}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Reason":
        origin = data.get("origin")
        return cls(str(data.get("arg", "")), str(data.get("says", "")),
                   dict(origin) if isinstance(origin, Mapping) else None, bool(data.get("untrusted")),
                   bool(data.get("asks")), str(data.get("value", "")))


@dataclass(frozen=True)
class LineageVerdict:
    ask: bool
    reasons: tuple[Reason, ...]  # one per destination looked at

    def to_dict(self) -> dict[str, Any]:
        return {"ask": self.ask, "reasons": [r.to_dict() for r in self.reasons]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LineageVerdict":
        reasons = data.get("reasons")
        items = reasons if isinstance(reasons, list) else []
        return cls(bool(data.get("ask")), tuple(Reason.from_dict(r) for r in items if isinstance(r, Mapping)))


def judge(
    *,
    address: str,
    input_schema: Mapping[str, Any] | None,
    args: Mapping[str, object],
    flow: DataFlow,
    untrusted_called: Mapping[str, Origin],
    untrusted_values: Mapping[str, Origin],
    trusted_values: Container[str] = frozenset(),
    allowlist: Sequence[str] = (),
    role_overrides: Mapping[str, str] | None = None,
    positional: Sequence[str] | None = None,
    run_id: str = "",
) -> LineageVerdict:
    """The verdict on one call of ``address`` with bound keyword ``args``.

    ``untrusted_called``: the untrusted tools this run called before this call (address -> its latest
    call). ``untrusted_values``: mark norm -> where it was seen, for this run and this principal's recent
    runs. ``trusted_values``: mark norms trusted results held (a Mapping to Origin names them).
    ``positional``: the tool's positional parameter order (``tools.params.parameters(tool).positional``);
    without it, the schema's order (required first), as MCP and OpenAPI tools bind. ``run_id``: this run,
    so a reason says "at call 3" for it and "in run r-1, call 2" for another.
    """
    try:
        return _judge(address, input_schema, args, flow, untrusted_called, untrusted_values, trusted_values,
                      allowlist, role_overrides, positional, run_id)
    except Exception:  # a fault here must make the write wait for a person, never let it pass
        return LineageVerdict(True, (Reason("", "the lineage of this call could not be judged", None, True, True),))


def _judge(address: str, input_schema: Mapping[str, Any] | None, args: Mapping[str, object], flow: DataFlow,
           untrusted_called: Mapping[str, Origin], untrusted_values: Mapping[str, Origin],
           trusted_values: Container[str], allowlist: Sequence[str], role_overrides: Mapping[str, str] | None,
           positional: Sequence[str] | None, run_id: str) -> LineageVerdict:
    if not isinstance(args, Mapping):
        args = {}
    order = list(positional) if positional is not None else _schema_order(input_schema)
    role = roles(input_schema, args, role_overrides)
    allowed = _Allowlist(allowlist)
    ctx = _Context(flow, untrusted_called, untrusted_values, trusted_values, allowed, run_id)

    reasons: list[Reason] = []
    for i, (name, value) in enumerate(args.items()):
        if i >= MAX_ARGS:
            break
        static = flow.sources_for(address, str(name), order)
        if role.get(name) == DESTINATION:
            reasons += ctx.destination(str(name), value, static)
        else:
            reasons += ctx.inside(str(name), value, static)
    # The reasons that ask come first when there are too many to show: a page of benign ones never hides one.
    reasons = ([r for r in reasons if r.asks] + [r for r in reasons if not r.asks])[:MAX_REASONS]
    return LineageVerdict(any(r.asks for r in reasons), tuple(reasons))


# -- the parts ------------------------------------------------------------------------------------------------


class _Allowlist:
    def __init__(self, entries: Sequence[str]) -> None:
        self.exact: set[str] = set()
        self.globs: list[str] = []
        for entry in list(entries)[:1024]:
            if not isinstance(entry, str) or not entry.strip():
                continue
            if any(ch in entry for ch in "*?["):
                self.globs.append(entry.strip().casefold())
            else:
                whole = normalise(entry)
                self.exact.add(whole)
                # An entry's own address or link; a link's host only when the entry is that host (allowing one
                # URL does not allow every page of its site).
                self.exact.update(m.norm for m in marks(entry, limit=8)
                                  if m.kind != "text" and (m.kind != "host" or m.norm == whole))

    def holds(self, norms: Sequence[str]) -> bool:
        return any(n in self.exact or any(fnmatch.fnmatchcase(n, g) for g in self.globs) for n in norms)


class _Unit:
    """One value judged: a whole scalar, one address in a string, one item of a list."""

    __slots__ = ("label", "shown", "marks", "norms", "whole", "parents", "unread")

    def __init__(self, label: str, shown: str, found: list[Mark], whole: str | None, unread: bool = False) -> None:
        self.label = label
        self.unread = unread  # past what one judgement reads (MAX_SCANNED)
        self.shown = shown[:_SHOWN]
        self.marks = found
        self.whole = whole or None
        norms = [m.norm for m in found]
        norms += [host_of(m.norm) for m in found if m.kind == "url"]
        if whole is not None:
            norms.append(whole)
        self.norms = list(dict.fromkeys(n for n in norms if n))
        # The domains a link's host lies under: whoever holds evil.com holds a.evil.com (matched, never holding).
        hosts = [host_of(m.norm) if m.kind == "url" else m.norm for m in found if m.kind in ("url", "host")]
        self.parents = list(dict.fromkeys(p for h in hosts for p in _parents(h) if p not in self.norms))

    @property
    def matchable(self) -> bool:
        return bool(self.marks)


class _Context:
    def __init__(self, flow: DataFlow, called: Mapping[str, Origin], untrusted: Mapping[str, Origin],
                 trusted: Container[str], allowed: _Allowlist, run_id: str) -> None:
        self.flow = flow
        self.called = called
        self.untrusted = untrusted
        self.trusted = trusted
        self.allowed = allowed
        self.run_id = run_id
        self.budget = [MAX_SCANNED]  # characters left to scan in this judgement

    # -- a destination argument --

    def destination(self, name: str, value: object, static: frozenset[str] | None) -> list[Reason]:
        units = _units(name, value, self.budget)
        return _shown(self.unit(u, static, inside=None) for u in units)

    def inside(self, name: str, value: object, static: frozenset[str] | None) -> list[Reason]:
        """Links, addresses and IBANs inside a content argument, each judged like a destination."""
        return _shown(self.unit(u, static, inside=name) for u in _carried(name, value, self.budget))

    def unit(self, u: _Unit, static: frozenset[str] | None, *, inside: str | None) -> Reason:
        def reason(says: str, *, asks: bool, untrusted: bool = False, origin: Origin | None = None) -> Reason:
            return Reason(u.label, says, origin.to_dict() if origin is not None else None, untrusted, asks, u.shown)

        if u.unread:
            if not self.called:
                return reason("not read past the judge's bound; no untrusted result was read before this call",
                              asks=False)
            origin = self.latest(sorted(self.called))
            return reason(f"not read: the rest of this value is past what one write's judgement reads, and the run "
                          f"read {self.result_of(origin)}", asks=True, untrusted=True, origin=origin)
        if self.allowed.holds(u.norms):
            return reason("on the allowlist", asks=False)
        trusted = self.trusted_holder(u)
        literal = any(n in self.flow.literals for n in u.norms)
        hits = self.hits(u, static, literal=literal)
        derived = sorted(set(static) & set(self.called)) if static else []
        if derived:
            # The static pass traces it to an untrusted result of this run. A literal of the program cannot carry
            # one (the program was fixed before its run's results arrived); an earlier run's value is a hit.
            # A value a trusted result holds and no untrusted result does is one the trace could only have picked
            # among the user's own (another call site of the tool, an index computed from untrusted data): the
            # selection limit, as for a match by value.
            if u.matchable and not hits and literal:
                return reason("typed in the program", asks=False)
            if u.matchable and trusted is not None and not self.hits(u, static, literal=False):
                return reason(f"held by {trusted}, and by no untrusted result", asks=False)
            if hits:
                return reason(self.copied(hits), asks=True, untrusted=True, origin=hits)
            origin = self.latest(derived)
            says = (f"in {inside}, which is built from {self.result_of(origin)}" if inside is not None
                    else f"from {self.result_of(origin)}")
            return reason(says, asks=True, untrusted=True, origin=origin)
        if hits:
            if trusted is not None:
                return reason(f"also held by {trusted}, though {self.copied(hits)}", asks=False, untrusted=True,
                              origin=hits)
            return reason(self.copied(hits), asks=True, untrusted=True, origin=hits)
        if static is None and self.called:
            # The pass cannot tell, and the run read untrusted results: what nothing trusted holds asks.
            if u.matchable and (literal or trusted is not None):
                return reason("typed in the program" if literal else f"held by {trusted}", asks=False)
            origin = self.latest(sorted(self.called))
            return reason(f"never seen in this conversation: no trusted result, literal of the program or allowlist "
                          f"holds it, and the program's flow could not be followed past {self.result_of(origin)}",
                          asks=True, untrusted=True, origin=origin)
        if literal:
            return reason("typed in the program", asks=False)
        if trusted is not None:
            return reason(f"held by {trusted}", asks=False)
        if self.called and u.matchable and static is not None and not static and not self.typed_domain(u):
            # Traced to no result at all, yet held by nothing the user or the program gave: rebuilt from untrusted
            # data by comparisons (a character picked from an alphabet where it equals one read, a loop's count),
            # the implicit flows the pass does not follow. A value traced to a result not marked untrusted goes
            # (a write's result — a new link, a new id — is no trusted read's, yet the program's to use).
            origin = self.latest(sorted(self.called))
            return reason(f"never seen in this conversation: no trusted result, literal of the program or allowlist "
                          f"holds it, and the program built it after reading {self.result_of(origin)}",
                          asks=True, untrusted=True, origin=origin)
        if static:
            names = ", ".join(f"{a}()" for a in sorted(static)[:3])
            return reason(f"from a result of {names}, not marked untrusted", asks=False)
        if static is None:
            return reason("no untrusted result was read before this call", asks=False)
        return reason("built by the program from its own values", asks=False)

    def typed_domain(self, u: _Unit) -> bool:
        """Whether the program typed the domain of an address it built (``name + "@corp.example"``): a program is
        fixed before its run's results arrive, so it cannot have typed a domain only they named."""
        domains = [m.norm.rpartition("@")[2] for m in u.marks if m.kind == "email"]
        return any(d and (d in self.flow.literals or "@" + d in self.flow.literals) for d in domains)

    def hits(self, u: _Unit, static: frozenset[str] | None, *, literal: bool) -> Origin | None:
        """The untrusted result a value matches, if any: the most specific mark, this run's call first."""
        hits = [(m, self.untrusted[m.norm]) for m in u.marks if m.norm in self.untrusted]
        # A link to a host an untrusted result named, whatever its path: where the data goes is the host.
        hits += [(m, self.untrusted[n]) for m in u.marks if m.kind == "url"
                 for n in [host_of(m.norm)] if n in self.untrusted]
        hits += [(Mark("host", p, ""), self.untrusted[p]) for p in u.parents if p in self.untrusted]
        # The whole value, even a short one, against values an untrusted text quoted ("the file with ID '13'").
        if u.whole is not None and u.whole in self.untrusted and not any(h[0].norm == u.whole for h in hits):
            hits.append((Mark("id", u.whole, ""), self.untrusted[u.whole]))
        if literal and self.run_id:
            # A literal was typed before any result of this run arrived: only an earlier run can be its source.
            hits = [h for h in hits if h[1].run_id != self.run_id]
        if not hits:
            return None
        if static:
            # Derived in this run too: name this run's call, which is what the program did.
            mine = [h for h in hits if h[1].address in static and h[1].address in self.called
                    and (not h[1].run_id or h[1].run_id == self.run_id)]
            hits = mine or hits
        mark, origin = _first_hit(hits)
        return Origin(origin.address, origin.run_id, origin.seq, origin.path, origin.kind or mark.kind)

    def latest(self, addresses: Sequence[str]) -> Origin:
        return self.called[sorted(addresses, key=lambda a: (-(self.called[a].seq or 0), a))[0]]

    # -- phrases --

    def trusted_holder(self, u: _Unit) -> str | None:
        for n in u.norms:
            if n in self.trusted:
                held = self.trusted.get(n) if isinstance(self.trusted, Mapping) else None
                if isinstance(held, Origin) and held.address == USER_WORDS:
                    return "the user's own words"
                if isinstance(held, Origin):
                    return f"the trusted result of {held.address}(){self.where(held)}"
                return "a trusted result"
        return None

    def where(self, origin: Origin) -> str:
        if origin.seq is None:
            return f" in run {origin.run_id}" if origin.run_id and origin.run_id != self.run_id else ""
        if origin.run_id and origin.run_id != self.run_id:
            return f" in run {origin.run_id}, call {origin.seq}"
        return f" at call {origin.seq}"

    def result_of(self, origin: Origin) -> str:
        return f"{_field(origin.path)}the result of {origin.address}(){self.where(origin)}"

    def copied(self, origin: Origin) -> str:
        what = _KIND_WORDS.get(origin.kind, "the value")
        if origin.run_id and origin.run_id != self.run_id:
            return f"{what} was copied from {self.result_of(origin)}"
        return f"{what} is in {self.result_of(origin)}"


def lookups(args: Mapping[str, object]) -> list[str]:
    """Every norm :func:`judge` may look up in ``untrusted_values`` and ``trusted_values`` for these arguments,
    whatever their roles: an index can be asked for these alone, and ``judge`` given what it found."""
    out: dict[str, None] = {}
    if not isinstance(args, Mapping):
        return []
    for i, (name, value) in enumerate(args.items()):
        if i >= MAX_ARGS:
            break
        budget = [MAX_SCANNED]
        for u in [*_units(str(name), value, budget), *_carried(str(name), value, budget)]:
            out.update(dict.fromkeys(u.norms))
            out.update(dict.fromkeys(u.parents))
    return list(out)


def _carried(name: str, value: object, budget: list[int]) -> list[_Unit]:
    """The destinations inside a content value, one unit each (a link's host goes with its link)."""
    found: dict[tuple[str, str], Mark] = {}
    unread = False
    for piece in _slices(value):
        if budget[0] <= 0:
            unread = True
            break
        budget[0] -= _cost(piece)
        for m in destinations_in(piece, limit=MAX_JUDGED):
            found.setdefault((m.kind, m.norm), m)
    by_url = {host_of(m.norm) for m in found.values() if m.kind == "url"}
    units = [_Unit(f"{name} → {_KIND_WORDS.get(m.kind, m.kind).removeprefix('the ')}", m.norm, [m], None)
             for m in found.values() if not (m.kind == "host" and m.norm in by_url)][:MAX_JUDGED]
    if unread:
        units.append(_Unit(f"{name} → the rest", "", [], None, unread=True))
    return units


def _cost(value: object) -> int:
    """Characters the scanner may read of ``value`` (values.MAX_CHARS at most)."""
    total, stack, nodes = 0, [value], 0
    while stack and total < 65_536 and nodes < 10_000:
        item = stack.pop()
        nodes += 1
        if isinstance(item, str):
            total += min(len(item), 16_384) + 1
        elif isinstance(item, Mapping):
            stack.extend(item.values())
            total += len(item)
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
            total += 1
        else:
            total += 8
    return min(total, 65_536) + (64 if stack else 0)


def _slices(value: object) -> list[object]:
    """A content value as it is searched for destinations: a long string in overlapping slices (the scanner reads
    the start of each string only), anything else whole."""
    if not isinstance(value, str) or len(value) <= _SLICE:
        return [value]
    text = value[:MAX_TEXT]
    return [text[i:i + _SLICE] for i in range(0, max(1, len(text) - _OVERLAP), _SLICE - _OVERLAP)]


def _shown(reasons: Iterable[Reason]) -> list[Reason]:
    """Every reason that asks, and the first of those that need not."""
    out, calm = [], 0
    for r in reasons:
        if r.asks or calm < MAX_UNITS:
            out.append(r)
            calm += not r.asks
    return out


def _units(name: str, value: object, budget: list[int]) -> list[_Unit]:
    """The values a destination argument holds: each item of a list, each address in a string."""
    items: list[tuple[str, object]]
    if isinstance(value, (list, tuple)):
        items = [(f"{name}[{i}]", v) for i, v in enumerate(value[:MAX_JUDGED])]
    else:
        items = [(name, value)]
    units: list[_Unit] = []
    for label, item in items:
        if item is None or isinstance(item, bool):
            continue
        if budget[0] <= 0:
            units.append(_Unit(label, "", [], None, unread=True))
            break
        budget[0] -= _cost(item)
        shown = item if isinstance(item, str) else _dump(item)
        # A name is matched as the whole value (values.py keeps names from results for that lookup alone).
        found = [m for m in marks(item, limit=MAX_JUDGED) if m.kind not in ("text", "name")]
        if isinstance(item, str) and len(item) <= _SHORT and ("%" in item or any(c.isspace() for c in item.strip())):
            # A destination field is one value: "a @ evil.com" or "a%40evil.com" typed there reaches the same place
            # once a form or a URL layer strips the spaces or decodes it.
            seen = {m.norm for m in found}
            compact = "".join(item.split())
            for variant in dict.fromkeys((compact, unquote(compact))):
                found += [m for m in marks(variant, limit=8) if m.kind not in ("text", "name") and m.norm not in seen]
        by_url = {host_of(m.norm) for m in found if m.kind == "url"}
        found = [m for m in found if not (m.kind == "host" and m.norm in by_url)]
        whole = normalise(shown) if isinstance(item, (str, int, float)) else None
        if len(found) <= 1:
            units.append(_Unit(label, shown, found, whole))
        else:
            units += [_Unit(label, m.norm, [m], None) for m in found]
    return units


# Second-level labels under a two-letter ending that registries hand out (co.uk, com.au): not one owner's domain.
_SHARED_SECOND = frozenset({"co", "com", "net", "org", "gov", "ac", "edu", "ne", "or", "go", "gv", "ltd", "plc"})


def _parents(host: str) -> list[str]:
    """``a.b.evil.com`` -> ``["b.evil.com", "evil.com"]``: the domains above a host, down to two labels."""
    labels = host.split(".")[:10]
    out = []
    for i in range(1, len(labels) - 1):
        parent = labels[i:]
        if len(parent) == 2 and len(parent[1]) == 2 and parent[0] in _SHARED_SECOND:
            break
        out.append(".".join(parent))
    return out


def _first_hit(hits: list[tuple[Mark, Origin]]) -> tuple[Mark, Origin]:
    # The most specific kind first (an address over its host), then the latest call: what a person checks.
    rank = {"email": 0, "iban": 0, "phone": 0, "url": 1, "id": 2, "host": 3, "text": 4}
    return sorted(hits, key=lambda h: (rank.get(h[0].kind, 5), -(h[1].seq or 0), h[1].run_id))[0]


def _field(path: str) -> str:
    m = _FIELD.search(path or "")
    if m is None:
        return ""
    name = next(g for g in m.groups() if g is not None)
    return f'the "{name[:40]}" field of '


def _dump(value: object) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, default=str)[:_SHOWN]
    except (TypeError, ValueError, RecursionError):
        return str(type(value).__name__)


def _schema_order(schema: Mapping[str, Any] | None) -> list[str]:
    """The positional order MCP and OpenAPI tools bind by (tools/params.py): required first, then the rest."""
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(props, Mapping):
        return []
    required = schema.get("required") if isinstance(schema, Mapping) else None
    req = {n for n in required if isinstance(n, str)} if isinstance(required, list) else set()
    return [n for n in props if n in req] + [n for n in props if n not in req]
