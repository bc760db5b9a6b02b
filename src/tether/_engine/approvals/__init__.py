"""Approvals: who may decide a paused write, through which channel (P-37).

One home for approvals: the model (model.py), the service that alone creates
and settles approval waits and takes every decision (service.py), the
capabilities every token and MAC is made with (capabilities.py), and the
rights of principals — the one pure decision every surface asks before it
decides a write: the MCP server (``resume``, form answers), the console, and
approval links. Whatever the surface, the same question gets the same answer
here. Only rights are imported here: the engine imports capabilities.py and
model.py without loading the service.
"""

from tether._engine.approvals.rights import (
           APPROVE,
           CAPABILITY,
           METRICS,
           OPERATE,
           OPERATOR,
           RIGHTS,
           RUN,
           SIGNED_IN,
           Access,
           Channel,
           Grant,
           Verdict,
           kind_of,
           may_decide,
           may_see,
           needs_signed_in,
           sees_local,
           shown_as,
           visible_owners,
)

__all__ = ["APPROVE", "CAPABILITY", "METRICS", "OPERATE", "OPERATOR", "RIGHTS", "RUN", "SIGNED_IN", "Access", "Channel",
           "Grant", "Verdict", "may_decide", "kind_of", "may_see", "needs_signed_in", "sees_local", "shown_as",
           "visible_owners"]
