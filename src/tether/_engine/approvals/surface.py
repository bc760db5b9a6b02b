"""What every approval surface asks of a paused run before deciding: which rule applies, and where to send people.

Thin over :mod:`.rights`, which stays pure: here the run's recorded policy
and its pause are read, and a refusal becomes the error a surface reports.
"""

from __future__ import annotations

from typing import Any, Iterable

from tether._engine.approvals.rights import Verdict, needs_signed_in
from tether.errors import (
    ApprovalElsewhere,
    ApprovalRefused,
    NotAnApprover,
    RunNotFound,
    SelfApproval,
    SignInRequired,
    TetherError,
)

# A refusal's class by the verdict's code (rights.py decides the code; each code is one class).
_REFUSED: dict[str, type[ApprovalRefused]] = {
    "sign_in_required": SignInRequired, "not_an_approver": NotAnApprover, "self_approval": SelfApproval}


def batch(run: Any) -> list[dict[str, Any]]:
    pending = getattr(run, "pending", None) or {}
    return list(pending.get("writes") or ([pending] if pending.get("address") else []))


def signed_in_required(run: Any, seqs: Iterable[int] | None = None) -> bool:
    """Whether any of the run's paused writes ``seqs`` (all of them with None) requires a signed-in approver.

    Read from the run's recorded policy: a decision is checked against the
    rules the run ran under (and that record is signed, P-35).
    """
    rules = (getattr(run, "policy", None) or {}).get("rules") or []
    wanted = None if seqs is None else set(seqs)
    return any(needs_signed_in(rules, str(w.get("address")))
               for w in batch(run) if wanted is None or w.get("seq") in wanted)


def where_to_approve(public_url: str | None, run_id: str, *, console: bool = True, owner: str | None = None) -> str:
    """Where a person approves a run's writes, in words an agent can pass on.

    ``console``: whether this server has one (HTTP); a public URL implies it. ``owner``: the run's principal,
    which the command line must name to act on a run it did not start.
    """
    acting = f" --as {owner}" if owner and owner != "local" else ""
    store = f"with `tether resume {run_id} --approve --seq N{acting}` on the store"
    if not public_url and not console:
        return f"a person approves it {store}"
    where = f"{public_url.rstrip('/')}/console/runs/{run_id}" if public_url else f"/console/runs/{run_id} on this server"
    return (f"a person approves it on the console at {where} (signed in with a token that may approve), through "
            f"the approval link delivered to them, or {store}")


def refusal(verdict: Verdict, run_id: str, public_url: str | None, *, paused: bool = True,
            console: bool = True, owner: str | None = None) -> TetherError:
    """The error a surface reports for a refused decision: nothing was decided, nothing was sent."""
    if verdict.code == "run_not_found":
        return RunNotFound(f"no run {run_id!r}")
    text = f"{verdict.message}; nothing was decided and nothing was sent"
    if paused:
        text += f"; run {run_id} stays paused"
    if verdict.code == "approval_elsewhere":
        where = where_to_approve(public_url, run_id, console=console, owner=owner)
        return ApprovalElsewhere(f"{text}. {where[0].upper()}{where[1:]}.")
    return _REFUSED.get(verdict.code or "", ApprovalRefused)(text)
