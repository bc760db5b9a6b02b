"""Approvals: who may decide a paused write, through which channel (issue 19).

The first piece of "one home for approvals": the rights of principals and the
one pure decision every surface asks before it decides a write — the MCP
server (``resume``, form answers), the console, and approval links. Whatever
the surface, the same question gets the same answer here.
"""

from .rights import (
    APPROVE,
    CAPABILITY,
    OPERATE,
    OPERATOR,
    RIGHTS,
    RUN,
    SIGNED_IN,
    Access,
    Channel,
    Grant,
    Verdict,
    may_decide,
    may_see,
    needs_signed_in,
    visible_owners,
)

__all__ = ["APPROVE", "CAPABILITY", "OPERATE", "OPERATOR", "RIGHTS", "RUN", "SIGNED_IN", "Access", "Channel",
           "Grant", "Verdict", "may_decide", "may_see", "needs_signed_in",
           "visible_owners"]
