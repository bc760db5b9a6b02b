"""Approvals where people are: approval links, and deciding a paused write on someone's behalf.

An approval link is a URL ``<public_url>/approve/<token>`` for one pending
write: whoever holds it sees the write; deciding needs a signed-in approver
unless ``[server] links = "capability"`` (tether.approvals says who may). The token names the
run, the write's seq and the moment the approval's time to live ends, and is
signed with a key derived from the store's secret, so every process sharing
the store mints and accepts the same links. It decides once: after a
decision, after the time to live, or altered by a single character, it
decides nothing and says why (P-33).

:class:`Decider` is the console's and the links' adapter to the approvals
service: it asks ``tether.approvals.service.refusal`` whether a decision would
take anything (so the page answers at once), then calls ``Runtime.decide``
(which records who decided, through what — ``console``, ``link`` — and from
where as a ``decided`` event in the run's timeline) and lets the run continue
in the background. Whether the caller may decide is asked before, of
``tether.approvals.may_decide``.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from ..approvals.capabilities import APPROVAL_LINK, Keyring
from ..approvals.model import taken as taken_of
from ..approvals.service import pending, refusal
from ..errors import TetherError
from ..store.base import RunRecord
from ..store.states import RunStatus

if TYPE_CHECKING:
    from ..runs.runtime import Runtime
    from .admission import Admission

# How long a decision waits for the run to move on before the page answers:
# a short write finishes inside it and the page shows the outcome; a long one
# goes on in the background and the page shows it running.
SETTLE_SECONDS = 3.0
# Room for a write's values on its page before each folds (its whole value is one click away).
PAGE_ARGS_CHARS = 1200


def link_token(secret: bytes, run_id: str, seq: int, expires_at: float) -> str:
    return APPROVAL_LINK.mint(secret, [run_id, seq, round(expires_at, 3)])


@dataclass(frozen=True)
class LinkClaim:
    run_id: str
    seq: int
    expires_at: float


def open_token(secret: bytes | Sequence[bytes] | Keyring, token: str) -> LinkClaim | None:
    """The claim of a genuine token; None for a forged, altered or malformed one.

    ``secret`` may be several (a keyring's current and older ones): a link handed out before the
    secret was rotated still opens while the older secret is kept for verification.
    """
    try:
        run_id, seq, expires_at = APPROVAL_LINK.open(secret, token)
    except (ValueError, TypeError):
        return None
    if not isinstance(run_id, str) or type(seq) is not int or not isinstance(expires_at, (int, float)):
        return None
    return LinkClaim(run_id, seq, float(expires_at))


def approval_url(public_url: str | None, secret: bytes, run_id: str, seq: int, expires_at: float) -> str | None:
    """The link for one pending write, or None when no public URL is configured."""
    if not public_url:
        return None
    return f"{public_url.rstrip('/')}/approve/{link_token(secret, run_id, seq, expires_at)}"


def run_links(rt: Runtime, public_url: str | None, run: RunRecord) -> list[dict[str, Any]]:
    """``[{seq, address, url}]`` for each write the run waits on."""
    if run.status != RunStatus.PAUSED or run.expires_at is None:
        return []
    return [{"seq": w["seq"], "address": w["address"],
             "url": approval_url(public_url, rt.keyring.current, run.run_id, w["seq"], run.expires_at)}
            for w in pending_writes(rt, run)]


# -- what waits ---------------------------------------------------------------------


def pending_writes(rt: Runtime, run: RunRecord) -> list[dict[str, Any]]:
    """The writes a paused run still waits on (a batch pause's decided ones left out).

    ``[{seq, address, args, annotations, description}]``, from ``Runtime.pending``.
    """
    if run.status != RunStatus.PAUSED or not run.pending:
        return []
    return [{"seq": w.seq, "address": w.address, "args": w.args, "annotations": w.annotations,
             "description": w.description} for w in pending(rt, run) if w.decision is None]


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
        run, refused = refusal(self.rt, run_id, seqs, decision, principal=principal, allowed=("approve", "decline"))
        if refused is not None:
            return Outcome(False, refused.code, refused.message, status=run.status if run is not None else None)
        return await self._decide(run_id, sorted(seqs), decision, reason, principal=principal, who=who, via=via,
                                  origin=origin)

    async def _decide(self, run_id: str, seqs: list[int], decision: str, reason: str | None, *,
                      principal: str | None, who: str, via: str, origin: str | None) -> Outcome:
        def taken() -> bool:
            # The journal's compare-and-set is the decision (P-28): once every
            # named write holds it, the page can say so, whatever the run does next.
            return all(taken_of(self.rt.store.get_call(run_id, s)) == decision for s in seqs)

        async def go() -> Any:
            async with self._slot():
                # rt.decide records who decided, through what and from where (P-29),
                # then continues the run once its whole pause is decided.
                return await self.rt.decide(run_id, {s: (decision, reason) for s in seqs}, principal=principal,
                                            actor=who, via=via, origin=origin)

        task = asyncio.ensure_future(go())
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        deadline = asyncio.get_running_loop().time() + self.settle_seconds
        decided = False
        while not task.done() and asyncio.get_running_loop().time() < deadline:
            if taken():
                decided = True
                break
            await asyncio.wait({task}, timeout=0.02)
        if not decided:
            if not task.done():
                return Outcome(True, status="queued", message="the decision waits for a free run slot")
            exc = task.exception() if not task.cancelled() else None
            if isinstance(exc, TetherError):
                return Outcome(False, exc.code, f"{exc.message}; nothing was decided")
            if exc is not None:
                return Outcome(False, "internal_error", f"the decision failed ({type(exc).__name__}); "
                               "check the run before trying again")
            if not taken():
                return Outcome(False, "already_decided", "someone else decided this write first; nothing was decided")
        # Decided: give a quick run the rest of the moment to finish, so the
        # page can show its outcome.
        with contextlib.suppress(Exception):
            await asyncio.wait({task}, timeout=self.settle_seconds)
        run = self.rt.store.get_run(run_id)
        return Outcome(True, status=run.status if run else None)

    def _slot(self) -> Any:
        return self.admission.slot() if self.admission is not None else contextlib.nullcontext()

    def _finished(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: the page already reported what it could

    async def close(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


# -- showing a write to people ---------------------------------------------------------------


def describe_write(rt: Runtime, write: dict[str, Any]) -> dict[str, Any]:
    """A pending write as its page shows it: ``shown`` (tools/shown.py: every argument named, escaped,
    flagged, values shortened evenly, the description last) and whether its tool is destructive."""
    from ..tools.shown import show_call

    address = write.get("address")
    description = write.get("description")
    if description is None:
        try:
            if isinstance(address, str) and address in rt.catalog:
                description = rt.catalog.get(address).description
        except Exception:  # a catalog that cannot say is not a reason to hide the write
            description = None
    annotations = write.get("annotations") or {}
    shown = show_call(str(address), write.get("args"), description=description, budget=PAGE_ARGS_CHARS)
    return {**write, "shown": shown, "destructive": bool(annotations.get("destructive"))}
