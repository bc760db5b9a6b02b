"""Decisions on paused writes now live in the approvals package (tether._engine.approvals.service);
importable from here, as before."""

from tether._engine.approvals.model import (
           CHANNELS,
           ApprovalAnswer,
           Decision,
           PendingWrite,
           approval_verdict,
           batch_of,
           taken,
)
from tether._engine.approvals.service import decide, recorded_decision, unnamed_target
from tether._engine.approvals.service import pending as pending_writes

__all__ = ["CHANNELS", "ApprovalAnswer", "Decision", "approval_verdict", "PendingWrite", "batch_of", "decide", "pending_writes", "recorded_decision",
           "taken", "unnamed_target"]
