"""How the MCP server puts a paused write to a person: the one interface its approval channels use.

The channels — the inline form (2025 era), the input-required form (2026
era), the URL page (urlmode.py, both eras) and the paused result itself —
are adapters written against :class:`ApprovalHost`, never against the MCP
server class, so ``server/mcp.py`` imports them and none imports it back.
Whoever may decide is asked of ``tether.approvals``; what decides is the
runtime's one ``decide`` path (``rt.resume`` / ``rt.decide``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol

if TYPE_CHECKING:
    from ..runs.result import RunResult
    from ..runs.runtime import Runtime


class ApprovalHost(Protocol):
    """What an approval channel needs of the server it answers for."""

    rt: Runtime
    public_url: str | None
    url_wait_seconds: float  # how long a call waits for a decision taken on the page

    def approval_message_for(self, pending: Mapping[str, Any]) -> str:
        """The text a person reads about one waiting write (every argument named, P-38)."""
        ...

    def paused_result(self, result: RunResult, *, diagnostics: bool) -> Any:
        """The run's result for the model: says how to decide it, carries no approval link (D-32)."""
        ...

    def sign_state(self, run_id: str, seq: int, principal: str, *, mode: str | None = None) -> str:
        """Request state naming (run, seq) for this principal, signed, for an input-required round."""
        ...

    async def run_in_slot(self, start: Callable[[Any], Any], ctx: Any, principal: str, *,
                          run_id: str | None = None) -> RunResult:
        """Run ``start`` (a decision taking effect) within the server's admission control."""
        ...
