"""Questions from upstream tools: an MCP server's mid-call question (an elicitation) put to the run's user.

The question goes to the run's ``on_question`` (an MCP client's form in the
2025-11-25 era, the terminal for ``tether run``). A run without one — or a
question that cannot be tied to exactly one run — is declined: the upstream
call is open and cannot wait in a durable pause.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Mapping

from tether._engine.calls.boundary import EffectBoundary
from tether._engine.events import EventBus


def elicitation_handler(namespace: str, live: Mapping[str, EffectBoundary],
                        bus: EventBus) -> Callable[[Any], Awaitable[Any]]:
    """The handler an MCP source of ``namespace`` calls with a question; ``live``: the attempts running here."""
    from tether._sources.mcp import ElicitationResponse

    async def handle(request: Any) -> Any:
        prefix = f"{namespace}."
        wanted = f"{namespace}.{request.tool}" if request.tool else None
        # The run is the one with a call to that tool (or namespace) on the wire now.
        candidates = [b for b in list(live.values())
                      if any(n > 0 and (a == wanted if wanted else a.startswith(prefix))
                             for a, n in b.inflight_addresses.items())]
        if len(candidates) != 1 or candidates[0].on_question is None:
            return ElicitationResponse("decline")
        boundary = candidates[0]
        question = {"run_id": boundary.run_id, "address": wanted or namespace, "message": request.message,
                    "mode": request.mode, "schema": request.requested_schema, "url": request.url}
        bus.emit(boundary.run_id, "question", {k: question[k] for k in ("address", "message", "mode")})
        try:
            answer = await boundary.on_question(question)
        except Exception:  # the user could not be asked: not answering is the safe reply
            return ElicitationResponse("decline")
        action = answer.get("action") if isinstance(answer, dict) else None
        if action not in ("accept", "decline", "cancel"):
            return ElicitationResponse("decline")
        return ElicitationResponse(action, answer.get("content") if action == "accept" else None)

    return handle
