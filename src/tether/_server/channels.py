"""How the MCP server puts a paused write to a person: the approval channels and the one interface they use.

The channels — the inline form (2025 era), the input-required form (2026
era), the URL page (urlmode.py, both eras) and the paused result itself —
are adapters written against :class:`ApprovalHost`, never against the MCP
server class, so ``_server/mcp.py`` imports them and none imports it back.
Whoever may decide is asked of ``tether._engine.approvals``; what decides is the
runtime's one ``decide`` path (``rt.resume`` / ``rt.decide``).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping, Protocol

from mcp.server.elicitation import AcceptedElicitation, DeclinedElicitation, render_elicitation_schema
from mcp_types import ElicitRequest, ElicitRequestFormParams, InputRequiredResult
from pydantic import BaseModel, Field

if TYPE_CHECKING:
    from tether._engine.attempt.result import RunResult
    from tether._runtime import Runtime


class ApprovalHost(Protocol):
    """What an approval channel needs of the server it answers for."""

    rt: Runtime
    public_url: str | None
    url_wait_seconds: float  # how long a call waits for a decision taken on the page
    form_wait_seconds: float  # how long an approval form asked inside the call may stay open (D-88)

    def approval_message_for(self, pending: Mapping[str, Any]) -> str:
        """The text a person reads about one waiting write (every argument named, P-38)."""
        ...

    async def paused_result(self, result: RunResult, *, diagnostics: bool) -> Any:
        """The run's result for the model: says how to decide it, carries no approval link (D-32)."""
        ...

    def sign_state(self, run_id: str, seq: int, principal: str, *, mode: str | None = None) -> str:
        """Request state naming (run, seq) for this principal, signed, for an input-required round."""
        ...

    async def run_in_slot(self, start: Callable[[Any], Any], ctx: Any, principal: str, *,
                          run_id: str | None = None) -> RunResult:
        """Run ``start`` (a decision taking effect) within the server's admission control."""
        ...


# -- the form channels: inline (2025 era) and input-required (2026 era) -------------------

# The key of the one input request tether makes per round.
APPROVAL_KEY = "approval"


class ApprovalForm(BaseModel):
    """The form a paused write is put to the user as."""

    decision: Literal["approve", "decline"] = Field(
        description="approve: send the write. decline: do not send it; the program is told and goes on.")
    reason: str | None = Field(default=None, description="Optional; told to the program when declining.")


APPROVAL_SCHEMA = render_elicitation_schema(ApprovalForm)


def first_undecided(pending: Mapping[str, Any]) -> Mapping[str, Any]:
    """The first write of a pause still waiting for its decision (a pause stored before batches is one)."""
    writes = [w for w in (pending.get("writes") or [pending]) if not w.get("decision")]
    return writes[0] if writes else pending


def inline_form(host: ApprovalHost, ctx: Any, actor: str) -> Callable[[dict], Any]:
    """The approver an attempt asks inside the call (2025 era): the client's form, answered by its user."""

    async def approve(pending: dict) -> tuple[str, str | None]:
        try:
            # A client gone without a word never answers: the wait is bounded (D-88).
            async with asyncio.timeout(host.form_wait_seconds):
                answer = await ctx.elicit(host.approval_message_for(pending), ApprovalForm)
        except TimeoutError:
            return "decline", (f"the approval form had no answer within {host.form_wait_seconds:g} s "
                               "(the client may be gone)")
        except Exception as exc:  # the client could not ask: the safe answer is no
            return "decline", f"the approval form could not be shown ({type(exc).__name__}); it was not sent"
        if isinstance(answer, AcceptedElicitation):
            return answer.data.decision, answer.data.reason
        if isinstance(answer, DeclinedElicitation):
            return "decline", "the user declined it"
        # Dismissed: tether must decide now, and not sending is the safe choice.
        return "decline", "the user dismissed the approval form"

    # Recorded with each decision the form takes (P-29).
    approve.actor, approve.via = actor, "mcp"  # type: ignore[attr-defined]
    return approve


def input_required_form(host: ApprovalHost, result: RunResult, principal: str) -> InputRequiredResult:
    """The paused result as an input-required round (2026 era): one form, for the first undecided write (P-27)."""
    pending = first_undecided(result.pending or {})
    request = ElicitRequest(params=ElicitRequestFormParams(message=host.approval_message_for(pending),
                                                           requested_schema=APPROVAL_SCHEMA))
    state = host.sign_state(result.run_id, int(pending["seq"]), principal)
    return InputRequiredResult(input_requests={APPROVAL_KEY: request}, request_state=state)
