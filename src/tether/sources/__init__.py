"""Where tools come from: Python functions (``tether.sources.python``) and MCP
servers (``tether.sources.mcp``, imported on its own because it pulls in the
MCP client stack)."""

from .python import ToolSpec, tool, tools_from_module

__all__ = ["ToolSpec", "tool", "tools_from_module"]
