"""Decisions on paused writes now live in the approvals package (tether.approvals.service);
importable from here, as before."""

from ..approvals.model import CHANNELS, Decision, PendingWrite, batch_of, taken
from ..approvals.service import decide, recorded_decision, unnamed_target
from ..approvals.service import pending as pending_writes

__all__ = ["CHANNELS", "Decision", "PendingWrite", "batch_of", "decide", "pending_writes", "recorded_decision",
           "taken", "unnamed_target"]
