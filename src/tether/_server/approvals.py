"""Approvals where people are: approval links, and deciding a paused write on someone's behalf.

An approval link is a URL ``<public_url>/approve/<token>`` for one pending
write: whoever holds it sees the write; deciding needs a signed-in approver
unless ``[server] links = "capability"`` (tether._engine.approvals says who may). The token names the
run, the write's seq and the moment the approval's time to live ends, and is
signed with a key derived from the store's secret, so every process sharing
the store mints and accepts the same links. It decides once: after a
decision, after the time to live, or altered by a single character, it
decides nothing and says why (P-33); the same decision posted again is
accepted as at every door and changes nothing but a lost record (P-51).

:class:`Decider` is the console's and the links' adapter to the approvals
service: it asks ``tether._engine.approvals.service.refusal`` whether a decision would
take anything (so the page answers at once), then calls ``Runtime.decide``
(which records who decided, through what — ``console``, ``link`` — and from
where as a ``decided`` event in the run's timeline) and lets the run continue
in the background. Whether the caller may decide is asked before, of
``tether._engine.approvals.may_decide``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from tether._engine.approvals.capabilities import APPROVAL_LINK, Keyring
from tether._engine.approvals.model import taken as taken_of
from tether._engine.approvals.service import pending, refusal
from tether._engine.attempt.redaction import secret_args, shown_args
from tether._sources.kinds import KINDS
from tether._store.base import RunRecord
from tether._store.states import RunStatus
from tether.errors import TetherError

if TYPE_CHECKING:
    from tether._runtime import Runtime
    from tether._server.admission import Admission

# How long a decision waits for the run to move on before the page answers:
# a short write finishes inside it and the page shows the outcome; a long one
# goes on in the background and the page shows it running.
SETTLE_SECONDS = 3.0
# Room for a write's values on its page before each folds (its whole value is one click away).
PAGE_ARGS_CHARS = 1200


# The run event that says a decision the page answered "queued" for was refused when its turn came: the
# person is told on the run's page and the link's, where they look, with the code and message the page would
# have shown had the decision not waited (nothing more: no origin, no reason typed).
REFUSED_EVENT = "decision_refused"


# The mark of a link handed to the agent's own MCP client (URL-mode elicitation, D-57).
IN_BAND = "client"


def link_token(secret: bytes, run_id: str, seq: int, expires_at: float, *, in_band: bool = False) -> str:
    value: list[Any] = [run_id, seq, round(expires_at, 3)]
    return APPROVAL_LINK.mint(secret, [*value, IN_BAND] if in_band else value)


@dataclass(frozen=True)
class LinkClaim:
    run_id: str
    seq: int
    expires_at: float
    # Handed through the agent's own client: holding it is never enough, whatever [server] links says
    # (the client could open it itself), so deciding on it needs a signed-in approver (D-57).
    in_band: bool = False


def open_token(secret: bytes | Sequence[bytes] | Keyring, token: str) -> LinkClaim | None:
    """The claim of a genuine token; None for a forged, altered or malformed one.

    ``secret`` may be several (a keyring's current and older ones): a link handed out before the
    secret was rotated still opens while the older secret is kept for verification.
    """
    value = APPROVAL_LINK.open(secret, token)
    if not isinstance(value, list) or len(value) not in (3, 4) or (len(value) == 4 and value[3] != IN_BAND):
        return None
    run_id, seq, expires_at = value[:3]
    if not isinstance(run_id, str) or type(seq) is not int or not isinstance(expires_at, (int, float)):
        return None
    return LinkClaim(run_id, seq, float(expires_at), in_band=len(value) == 4)


def approval_url(public_url: str | None, secret: bytes, run_id: str, seq: int, expires_at: float, *,
                 in_band: bool = False) -> str | None:
    """The link for one pending write, or None when no public URL is configured.

    ``in_band``: the link goes through the agent's own MCP client (URL-mode elicitation), so it decides
    only for a signed-in approver even under ``links = "capability"`` (D-57).
    """
    if not public_url:
        return None
    return f"{public_url.rstrip('/')}/approve/{link_token(secret, run_id, seq, expires_at, in_band=in_band)}"


def run_links(rt: Runtime, public_url: str | None, run: RunRecord) -> list[dict[str, Any]]:
    """``[{seq, address, url}]`` for each write the run waits on."""
    if run.status != RunStatus.PAUSED or run.expires_at is None:
        return []
    return [{"seq": w["seq"], "address": w["address"],
             "url": approval_url(public_url, rt.engine.keyring.current, run.run_id, w["seq"], run.expires_at)}
            for w in pending_writes(rt, run)]


# -- what waits ---------------------------------------------------------------------


def pending_writes(rt: Runtime, run: RunRecord) -> list[dict[str, Any]]:
    """The writes a paused run still waits on (a batch pause's decided ones left out).

    ``[{seq, address, args, annotations, description, reasons}]``, from ``Runtime.pending`` (``reasons``
    only when lineage asked, P-45).
    """
    if run.status != RunStatus.PAUSED or not run.pending:
        return []
    return [{"seq": w.seq, "address": w.address, "args": w.args, "annotations": w.annotations,
             "description": w.description, **({"reasons": list(w.reasons)} if w.reasons else {})}
            for w in pending(rt.engine, run) if w.decision is None]


# -- deciding --------------------------------------------------------------------------


@dataclass
class Outcome:
    """What came of a decision: ``ok``, or why nothing was decided (``code`` + ``message``)."""

    ok: bool
    code: str | None = None
    message: str | None = None
    status: str | None = None  # the run's status when the page answered


class Decider:
    """Decides pending writes for the console and approval links; continues runs in the background."""

    def __init__(self, rt: Runtime, admission: Admission | None = None, settle_seconds: float = SETTLE_SECONDS) -> None:
        self.rt = rt
        self.admission = admission
        self.settle_seconds = settle_seconds
        self._tasks: set[asyncio.Task] = set()

    async def decide(self, run_id: str, seqs: list[int], decision: str, reason: str | None, *,
                     principal: str | None, who: str, via: str, origin: str | None = None) -> Outcome:
        """Decide the writes ``seqs`` of a paused run; nothing is decided unless each is still pending."""
        # What would make the decision take nothing is the service's to say (the same rules as decide);
        # asked first, since the decision itself may wait for a slot.
        run, refused = await self.rt.store.aio.call(refusal, self.rt.engine, run_id, seqs, decision, principal=principal,
                                                    allowed=("approve", "decline", "decline_and_undo"))
        if refused is not None:
            return Outcome(False, refused.code, refused.message, status=run.status if run is not None else None)
        return await self._decide(run_id, sorted(seqs), decision, reason, principal=principal, who=who, via=via,
                                  origin=origin)

    async def _decide(self, run_id: str, seqs: list[int], decision: str, reason: str | None, *,
                      principal: str | None, who: str, via: str, origin: str | None) -> Outcome:
        async def taken() -> bool:
            # The journal's compare-and-set is the decision (P-28): once every
            # named write holds it, the page can say so, whatever the run does next.
            # Awaited: this polls while the server serves others (D-27).
            entries = [await self.rt.store.aio.get_call(run_id, s) for s in seqs]
            return all(taken_of(e) == decision for e in entries)

        answered = {"queued": False}

        async def go() -> Any:
            try:
                # The slot is the run owner's (D-74): its program is what runs, whoever decided.
                async with self._slot(principal):
                    # rt.decide records who decided, through what and from where (P-29),
                    # then continues the run once its whole pause is decided.
                    return await self.rt.decide(run_id, {s: (decision, reason) for s in seqs}, principal=principal,
                                                actor=who, via=via, origin=origin)
            except TetherError as exc:
                if answered["queued"] and not await taken():
                    # The page said "queued" and the person left: the refusal is kept where they will look.
                    await self.rt.engine.events.emit_awaited(run_id, REFUSED_EVENT, {
                        "seqs": seqs, "decision": decision, "actor": who, "via": via, "code": exc.code,
                        "message": exc.message})
                raise

        task = asyncio.ensure_future(go())
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        deadline = asyncio.get_running_loop().time() + self.settle_seconds
        decided = False
        while not task.done() and asyncio.get_running_loop().time() < deadline:
            if await taken():
                decided = True
                break
            await asyncio.wait({task}, timeout=0.02)
        if not decided:
            if not task.done():
                answered["queued"] = True
                return Outcome(True, status="queued", message="the decision waits for a free run slot")
            exc = task.exception() if not task.cancelled() else None
            if isinstance(exc, TetherError):
                said = exc.message if "nothing was decided" in exc.message else f"{exc.message}; nothing was decided"
                return Outcome(False, exc.code, said)
            if exc is not None:
                return Outcome(False, "internal_error", f"the decision failed ({type(exc).__name__}); "
                               "check the run before trying again")
            if not await taken():
                return Outcome(False, "already_decided", "someone else decided this write first; nothing was decided")
        # Decided: give a quick run the rest of the moment to finish, so the
        # page can show its outcome.
        with contextlib.suppress(Exception):
            await asyncio.wait({task}, timeout=self.settle_seconds)
        run = await self.rt.store.aio.get_run(run_id)
        return Outcome(True, status=run.status if run else None)

    def _slot(self, principal: str | None) -> Any:
        return self.admission.slot(principal) if self.admission is not None else contextlib.nullcontext()

    def keep(self, task: asyncio.Task) -> None:
        """Hold a task the page started (an undo of an ended run, P-46) until it ends or the server closes."""
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the page already reported what it could

    async def close(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def refused_decisions(events: Sequence[Any], *, seq: int | None = None, via: str | None = None) -> list[dict[str, Any]]:
    """The queued decisions refused when their turn came, from a run's stored events (``REFUSED_EVENT``): each
    ``{seqs, decision, actor, via, code, message, at}``; only those on write ``seq`` or through ``via``, if given.
    One the same decision taken later on its writes (decided again once the cause went) is no longer news."""
    out: list[dict[str, Any]] = []
    for e in events:
        if e.type == "decided" and isinstance(e.data, dict):
            out = [r for r in out if not (e.data.get("seq") in (r.get("seqs") or [])
                                          and e.data.get("decision") == r.get("decision"))]
            continue
        data = e.data if e.type == REFUSED_EVENT and isinstance(e.data, dict) else None
        if data is None or (seq is not None and seq not in (data.get("seqs") or [])):
            continue
        if via is not None and data.get("via") != via:
            continue
        out.append({**data, "at": e.created_at})
    return out


# -- showing a write to people ---------------------------------------------------------------


def describe_write(rt: Runtime, write: dict[str, Any], run: RunRecord | None = None) -> dict[str, Any]:
    """A pending write as its page shows it: ``shown`` (_tools/shown.py: every argument named, escaped,
    flagged, secrets redacted, values shortened evenly, the description last), ``target`` (where it goes,
    see :func:`write_target`) and whether its tool is destructive."""
    from tether._engine.lineage.why import why_lines
    from tether._tools.shown import show_call

    address = write.get("address")
    description = write.get("description")
    tool = None
    try:
        if isinstance(address, str) and address in rt.catalog:
            tool = rt.catalog.get(address)
    except Exception:  # a catalog that cannot say is not a reason to hide the write
        tool = None
    if description is None and tool is not None:
        description = tool.description
    annotations = write.get("annotations") or {}
    if "secret_args" not in write and tool is not None:
        # A pause recorded before secret_args were: the tool's schema still says which.
        write = {**write, "secret_args": secret_args(tool)}
    shown = show_call(str(address), shown_args(write), description=description, budget=PAGE_ARGS_CHARS,
                      schema=tool.input_schema if tool is not None else None)
    return {**write, "shown": shown, "destructive": bool(annotations.get("destructive")),
            "target": write_target(tool, str(address), write.get("args") or {}, run),
            # Whether this write can be undone, and by what (P-46).
            "undo": tool.undo.address if tool is not None and tool.undo is not None else None,
            # Why lineage made it wait (writes = "guard", P-45): one line per destination that asked.
            "why": why_lines(write.get("reasons") or (), write.get("args") or {})}


def input_schema(rt: Runtime, address: Any) -> dict[str, Any] | None:
    """The input schema of the tool at ``address`` in this process's catalog: its ``format: password`` and
    ``writeOnly`` fields are secrets (_tools/shown.py). None when the catalog cannot say."""
    try:
        return rt.catalog.get(address).input_schema if isinstance(address, str) and address in rt.catalog else None
    except Exception:  # a catalog that cannot say leaves the rule by names
        return None


def write_target(tool: Any, address: str, args: dict[str, Any], run: RunRecord | None) -> dict[str, str] | None:
    """Where a write goes, for the person deciding it: ``{"kind", "text"}`` or None when nothing can say.

    Read from the run's signed source definitions (``meta.sources``, P-35) and
    from this process's catalog, never from the run's unsigned fields: an MCP
    tool's server (its command or URL, without credentials), an OpenAPI
    operation's method and URL with the path parameters filled in.
    """
    namespace = address.partition(".")[0]
    sources = ((run.meta or {}).get("sources") if run is not None else None) or []
    definition = next((d for d in sources if isinstance(d, dict) and d.get("namespace") == namespace), None)
    target = getattr(tool, "target", None)
    if isinstance(target, tuple) and len(target) == 2:
        method, template = target
        return {"kind": "http", "method": str(method), "text": _fill_path(str(template), args)}
    kind = KINDS.get(str(definition.get("type"))) if definition is not None else None
    if definition is not None and kind is not None and kind.title:
        if definition.get("url"):
            return {"kind": kind.name, "text": f"{kind.title} at {_public_url(str(definition['url']))}"}
        command = _shown_command([str(c) for c in definition.get("command") or []])
        if command:
            return {"kind": kind.name, "text": f"{kind.title} run as " + _shorten(command, 160)}
    source = getattr(tool, "source", None)
    if source == "python":
        return {"kind": "python", "text": "a Python tool in this server's own process"}
    if source == "mcp":
        return {"kind": "mcp", "text": f"the MCP server of namespace {namespace!r}"}
    return None


def _shown_command(command: list[str]) -> str:
    """A server's command line as an approver reads it: programs and scripts by file name, and no value
    given to a flag named like a secret (``--token X``, ``--api-key=X``)."""
    from tether._tools.shown import REDACTED, secret_name

    out: list[str] = []
    hide_next = False
    for word in command:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        flag, eq, _ = word.partition("=")
        if word.startswith("-") and secret_name(flag.lstrip("-")):
            out.append(f"{flag}={REDACTED}" if eq else word)
            hide_next = not eq
            continue
        out.append(word.rsplit("/", 1)[-1] if "/" in word and not word.startswith(("-", "@")) else word)
    return " ".join(out)


def _fill_path(template: str, args: dict[str, Any]) -> str:
    from urllib.parse import quote

    from tether._tools.shown import secret_name

    def fill(match: Any) -> str:
        name = match.group(1)
        arg = next((a for a in (name, name.replace("-", "_"), name.lower()) if a in args), None)
        if arg is None or args[arg] is None or secret_name(arg):
            return match.group(0)
        return quote(str(args[arg]), safe="")

    import re

    return _public_url(re.sub(r"\{([^}]+)\}", fill, template))


def _public_url(url: str) -> str:
    """A URL as it may be shown: no user or password, no query (an API key can travel in it)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return _shorten(url, 160)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
