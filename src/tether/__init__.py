"""tether: a durable code-mode execution engine for AI agents."""

from .errors import TetherError

__all__ = ["TetherError"]
