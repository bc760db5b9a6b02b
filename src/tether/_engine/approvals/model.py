"""The approvals model: an asked write, the pause that holds it, a pending write, a decision (P-10, P-27..P-29).

Pure data and the rules read off the journal; no store writes, no runtime.
The service (service.py) is what acts on them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Union

from tether._store.base import CallRecord, RunRecord
from tether._store.states import CallState, RunStatus
from tether.errors import InvalidApproval

# A paused write is a durable wait named approval:<seq>; its value is the decision.
APPROVAL_PREFIX = "approval:"
# What resolves an approval wait: the decisions a paused write can get (P-10); decline_and_undo also
# undoes the writes the run applied (P-46).
DECISIONS = ("approve", "decline", "cancel", "decline_and_undo")
# What undoes an ended run's writes (P-46): not a decision on a write, so no approval wait takes it.
UNDO = "undo"


def approval_wait_name(seq: int) -> str:
    """The name of the wait write ``seq`` of a pause is."""
    return f"{APPROVAL_PREFIX}{seq}"


def decision_of(value: Any, error: str | None) -> tuple[str | None, str | None]:
    """(decision, reason) an approval wait is resolved with by its key; decision None when it names none."""
    if error is not None:
        return "decline", error
    if isinstance(value, str):
        return value, None
    if isinstance(value, dict):
        return value.get("decision"), value.get("reason")
    return None, None


# Where a decision came from, recorded with it (P-29).
CHANNELS = ("python", "cli", "mcp", "console", "link", "key", "prompt")
# Journal states of a write someone approved (it may have been sent since).
_APPROVED_STATES = (CallState.APPROVED, CallState.SENDING, CallState.SENT, CallState.FAILED, CallState.UNKNOWN)


@dataclass(frozen=True)
class Decision:
    """A decision taken on one write (P-29): built once; every record of it is derived from it.

    The journal entry's state is what takes effect (P-28); this says who took
    it, from where, and why: as the run's ``decision``, its approval wait's
    value, and the ``decided`` event.
    """

    seq: int
    decision: str  # approve | decline | cancel | decline_and_undo
    reason: str | None = None
    actor: str | None = None  # who: a principal, a user name the console knows
    via: str | None = None  # through what: one of CHANNELS
    origin: str | None = None  # where the caller was, when the channel knows (a client address)
    at: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """As the run records it (``runs.decision``)."""
        return asdict(self)

    def wait_value(self) -> dict[str, Any]:
        """As the write's approval wait is resolved with (its seq is the wait's, its time the wait's)."""
        return {"decision": self.decision, "reason": self.reason, "actor": self.actor, "via": self.via,
                "origin": self.origin}

    def event(self, address: str) -> dict[str, Any]:
        """As the run's ``decided`` event shows it."""
        return {**self.to_dict(), "address": address}

    @classmethod
    def from_wait(cls, seq: int, which: str, value: Any, at: float | None) -> "Decision":
        """The decision ``which`` on write ``seq``, with who took it as its approval wait recorded."""
        value = value if isinstance(value, dict) else {}
        return cls(seq, which, value.get("reason"), value.get("actor"), value.get("via"), value.get("origin"), at)


@dataclass(frozen=True)
class PendingWrite:
    """One write of a pause, as an approver sees it (P-27)."""

    run_id: str
    seq: int
    address: str
    args: dict[str, Any]
    annotations: dict[str, Any] = field(default_factory=dict)
    description: str | None = None
    key: str | None = None  # the approval key: a capability that decides this write alone
    expires_at: float | None = None
    decision: Decision | None = None  # taken already; the run waits on the rest of its batch
    # Why it waits, per destination, when lineage asked (writes = "guard", P-45): each a Reason.to_dict()
    # of lineage/judge.py — "arg", "says" (the sentence a person reads), "origin", "untrusted", "asks".
    reasons: tuple[dict[str, Any], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["decision"] = self.decision.to_dict() if self.decision else None
        out["reasons"] = [dict(r) for r in self.reasons]
        return out

    def why(self) -> list[str]:
        """The reasons a person reads: those that made it ask, "<argument>: <sentence>" each, escaped and with
        secret arguments masked as every approval surface shows them (lineage/why.py)."""
        from tether._engine.lineage.why import why_lines

        return why_lines(self.reasons, self.args)


# What an inline approver (``execute(on_approval=...)``) may answer.
ApprovalAnswer = Union["Decision", str, bool, tuple[Union[str, bool], Union[str, None]]]
# An inline approver decides a write at once instead of pausing the run: it
# gets the pending call and answers with any ApprovalAnswer (see
# approval_verdict), returned or awaited.
Approver = Callable[[dict[str, Any]], Any]

_VERDICTS = {"approve": "approve", "decline": "decline", True: "approve", False: "decline"}


# A decision's reason is for a person to read: kept to this many characters at every door (console, links,
# MCP, Tasks, the Python API, an inline approver), so no door stores or hands the program a larger one.
MAX_REASON_CHARS = 2000


def kept_reason(reason: str | None) -> str | None:
    """``reason`` as it is recorded and told to the program: at most MAX_REASON_CHARS characters."""
    return reason[:MAX_REASON_CHARS] if reason is not None else None


def approval_verdict(answer: Any) -> tuple[str, str | None]:
    """An approver's answer as ``(approve | decline, reason)``; anything else is a usage error, never a guess.

    Accepted: ``"approve"`` / ``"decline"``, ``True`` / ``False``, a tuple
    ``(one of those, reason or None)``, or a :class:`Decision`.
    """
    reason: Any = None
    verdict: Any = answer
    if isinstance(answer, Decision):
        verdict, reason = answer.decision, answer.reason
    elif isinstance(answer, tuple) and len(answer) == 2:
        verdict, reason = answer
    found = _VERDICTS.get(verdict) if isinstance(verdict, (str, bool)) else None
    if found is None or not (reason is None or isinstance(reason, str)):
        raise InvalidApproval(
            f"on_approval answered {_show(answer)}; it must answer 'approve' or 'decline', True or False, "
            "a (verdict, reason) tuple or a tether.Decision. The write was not sent",
            next_action="Return one of those from the on_approval callback.",
            details={"answer": _show(answer)},
        )
    return found, kept_reason(reason)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "…"


def batch_of(run: RunRecord) -> list[dict[str, Any]]:
    """The writes a paused run waits on (a pause stored before batches lists one)."""
    if run.status != RunStatus.PAUSED or not run.pending:
        return []
    return list(run.pending.get("writes") or [run.pending])


# Decisions on one write that end its whole pause: no write of it is sent.
ENDS_PAUSE = ("cancel", "decline_and_undo")
# The code an approved write's entry ends with when its run expired before it was sent (P-51).
EXPIRED_WRITE = "write_expired"
# The code a write left asking ends with when its program ended before its run could pause (P-50).
NOT_DECIDED_WRITE = "write_not_decided"
# What a decision on one write does (``judge``).
TAKE, REPEAT, ENDED, CONFLICT, NOT_PENDING = "take", "repeat", "ended", "conflict", "not_pending"


def judge(decision: str, already: str | None, *, paused: bool, in_pause: bool, asked: bool) -> str:
    """What a decision on one write does, the same at every door and on every backend (P-28, P-51).

    ``already``: the decision the journal holds for the write (``taken``); ``paused``: whether its run is;
    ``in_pause``: whether the write is one its pause waits on; ``asked``: whether its entry still waits.

    - ``take``: it is taken, by the journal entry's compare-and-set while the run is paused;
    - ``repeat``: the journal holds this very decision: accepted, it changes nothing but a lost record (P-29);
    - ``ended``: the run is no longer paused and nobody decided this write but the end of the run (a cancel,
      a rollback, an expiry): nothing can be decided on it any more (``not_paused``);
    - ``conflict``: another decision was taken on this write (``already_decided``);
    - ``not_pending``: the run is paused but this write is not one it waits on (``write_not_pending``).
    """
    if already == decision:
        return REPEAT
    if decision in ENDS_PAUSE and in_pause and paused:
        return TAKE  # a cancel or a rollback ends the pause, whatever was decided on this write so far
    if not paused and (already is None or already in ENDS_PAUSE):
        return ENDED
    if already is not None:
        return CONFLICT
    return TAKE if in_pause and asked and paused else NOT_PENDING


# The two ends of a pause whose first step (the run's move) can outlive the process that took it (P-53), and a
# cancel of a run nobody was executing (Lifecycle.cancel_idle, D-90).
CUT_CANCEL, CUT_EXPIRY, CUT_IDLE = "cancel", "expired", "cancel_idle"


def pause_of(run: RunRecord) -> list[dict[str, Any]]:
    """The writes of the pause a run holds in its ``pending``, whatever its status (``batch_of`` is a paused run's)."""
    pending = run.pending if isinstance(run.pending, dict) else {}
    if "writes" in pending:
        return [w for w in pending["writes"] or [] if isinstance(w, dict) and isinstance(w.get("seq"), int)]
    return [pending] if isinstance(pending.get("seq"), int) and "address" in pending else []


def cut_end(run: RunRecord) -> str | None:
    """How a run's end was cut in half (P-53), or None: cancelled by a decision (``cancel``) or failed at its approval
    time to live (``expired``), and still holding its pause, which the end's last step clears with the envelope.

    Ending a run clears its ``pending`` in the same write as its envelope, so an ended run that holds one was left
    by a process that stopped between the end's two steps (the move, then the pause's writes and the envelope).
    A cancel of a run nobody was executing (``cancel_idle``) holds the run from its move to its envelope, which
    releases it: a cancelled run still held is one such cancel under way or cut (D-90).
    """
    if pause_of(run):
        if (run.status == RunStatus.CANCELLED and isinstance(run.decision, dict)
                and run.decision.get("decision") == "cancel"):
            return CUT_CANCEL
        if run.status == RunStatus.FAILED and run.error is None:
            return CUT_EXPIRY
    if run.status == RunStatus.CANCELLED and run.owner is not None:
        return CUT_IDLE
    return None


def ended_with(run: RunRecord, seq: int, entry: CallRecord | None) -> str | None:
    """The decision that ended the pause write ``seq`` belongs to while the end is still being carried out and the
    write's entry does not say so yet (P-51, P-53): ``cancel`` on a cancelled run still holding its pause,
    ``decline_and_undo`` on a run carrying out the rollback that declines it. None otherwise."""
    if entry is None or entry.kind != "write" or entry.state not in (CallState.ASKED, CallState.APPROVED):
        return None
    if cut_end(run) == CUT_CANCEL and any(w["seq"] == seq for w in pause_of(run)):
        return "cancel"
    pending = run.pending if isinstance(run.pending, dict) else {}
    plan = pending.get("rollback") if run.status == RunStatus.RUNNING else None
    if not isinstance(plan, dict):
        return None
    by = plan.get("by")
    if isinstance(by, dict) and by.get("decision") == "decline_and_undo" and seq in (plan.get("declined") or []):
        return "decline_and_undo"
    return None


def taken(entry: CallRecord | None) -> str | None:
    """The decision the journal holds for a write, if one was taken by someone."""
    if entry is None or entry.kind != "write":
        return None
    if entry.state in _APPROVED_STATES:
        return "approve"
    if entry.state == CallState.DECLINED:
        message = (entry.error or {}).get("message", "")
        if message.startswith((f"[{EXPIRED_WRITE}]", f"[{NOT_DECIDED_WRITE}]")):
            return None  # its run ended before it was sent or decided: nobody declined it (P-50, P-51)
        if message.startswith("[write_rolled_back]"):
            return "decline_and_undo"
        return "cancel" if message.startswith("[write_cancelled]") else "decline"
    return None
