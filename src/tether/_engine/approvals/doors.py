"""Which right each door of a server needs: one table, one check, for static tokens and OAuth alike (P-44).

A *door* is a way in: the MCP endpoint, the metrics scrape, the console's
pages, its decision forms, its live feed, an approval link, the CLI on the
store. Each names the rights that open it (any one of them; ``operate`` opens
every door, :meth:`Grant.can`). Whoever identified the caller — a static
token, an access token from the identity provider, a console session — asks
:func:`admits` before anything else happens, so the rule lives here once and
no route carries its own copy.

What a door admits is then cut further by the run: :func:`~.rights.may_see`
and :func:`~.rights.may_decide` say which runs and which decisions.
"""

from __future__ import annotations

from typing import Mapping

from tether._engine.approvals.rights import APPROVE, METRICS, OPERATE, RUN, Grant, Verdict


class Door:
    # POST/GET/DELETE /mcp: every MCP tool. Running a program is the agent's door: an approver's token
    # alone never runs one (nor answers its own client's approval form for it).
    MCP = "mcp"
    # GET /metrics on the main listener: counts across every principal.
    METRICS = "metrics"
    # GET /console/, /console/runs/{id}: the runs one may see.
    CONSOLE = "console"
    # GET /console/events: the live feed of those runs.
    EVENTS = "events"
    # POST /console/runs/{id}/decide and POST /approve/{token}, by decision.
    DECLINE = "decline"
    APPROVE = "approve"
    # The CLI and the Python API on the store (`--as OWNER` included): whoever holds the store.
    STORE = "store"


# The rights that open each door (any one of them); none: every principal the server knows. The console's
# pages, its feed and declining show or stop only runs the principal may see (its own, those it approves
# for), so they need no right beyond being someone: a person signed in through the identity provider has no
# scopes there, only what [auth.rights] grants by claim, and still follows and stops the runs their agents
# started with `tether:run`.
DOORS: Mapping[str, frozenset[str]] = {
    Door.MCP: frozenset({RUN}),
    Door.METRICS: frozenset({METRICS}),
    Door.CONSOLE: frozenset(),
    Door.EVENTS: frozenset(),
    Door.DECLINE: frozenset(),
    Door.APPROVE: frozenset({APPROVE}),
    Door.STORE: frozenset({OPERATE}),
}


def admits(grant: Grant | None, door: str) -> Verdict:
    """May ``grant`` come in through ``door``: ``ok``, or ``insufficient_rights`` naming the right it lacks."""
    needed = DOORS[door]
    if grant is not None and (not needed or any(grant.can(right) for right in needed)):
        return Verdict(True)
    names = " or ".join(sorted(needed))
    who = grant.name if grant is not None else "this caller"
    return Verdict(False, "insufficient_rights", f"{who} lacks the right {names}, which {door} needs")


def needed(door: str) -> str:
    """The right named in a refusal (and in an OAuth challenge's scope): the door's first, alphabetically."""
    return min(DOORS[door], default=RUN)


def door_of_decision(decision: str) -> str:
    """The door a console or approval-link decision comes through: declining sends nothing; every other
    decision (approving, and any that sends or undoes a write) is the approver's door."""
    return Door.DECLINE if decision == "decline" else Door.APPROVE
