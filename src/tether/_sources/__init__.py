"""Where tools come from: Python functions (``tether._sources.python``) and MCP
servers (``tether._sources.mcp``, imported on its own because it pulls in the
MCP client stack)."""

from tether._sources.python import ToolSpec, tool, tools_from_module

__all__ = ["ToolSpec", "tool", "tools_from_module"]
